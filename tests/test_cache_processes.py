"""Several processes share one response cache file; bad files fail clearly.

4 processes (spawn) x 4 threads start together, open the same (not yet existing) cache file and write and read
100 keys of their own and 20 keys shared by everyone: no 'database is locked' or any other error (the
lm-evaluation-harness bug #796), every key holds its value afterwards, and each key is stored once. A forked
child uses its own connections, a pickled cache reopens, and a file that is not a memlab cache (garbage,
truncated, another program's database, another schema) raises `CacheError` naming the file when opened,
leaving the file's bytes unchanged.
"""
import multiprocessing as mp
import pickle, random, sqlite3, traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from memlab.cache import ResponseCache, CacheError, request_key

N_PROC, N_THREAD, N_OWN, N_SHARED = 4, 4, 100, 20
SHARED = [f'shared-{j}' for j in range(N_SHARED)]


def request(name):
    return {'provider': 'test', 'base_url': 'http://localhost:0/v1', 'model': 'm',
            'messages': [{'role': 'user', 'content': name}], 'params': {'temperature': 0, 'timeout': 5}, 'sample': 0}

def value(name): return {'text': f'value of {name}', 'n': len(name)}
def own_names(p, t): return [f'p{p}-t{t}-{j}' for j in range(N_OWN)]


def _thread(cache, p, t):
    "Write and read back this thread's keys and the shared keys, in random order, with extra shared reads."
    rng = random.Random(100 * p + t)
    todo = own_names(p, t) + SHARED
    rng.shuffle(todo)
    for name in todo:
        got = cache.get(request(name))
        assert got in (None, value(name)), (name, got)
        cache.put(request(name), value(name))
        assert cache.get(request(name)) == value(name), name
        s = rng.choice(SHARED)
        assert cache.get(request(s)) in (None, value(s)), s


def _process(path, p, start, out):
    try:
        start.wait(60)                    # all processes open the new file at the same moment
        cache = ResponseCache(path, timeout=30)
        with ThreadPoolExecutor(N_THREAD) as ex: list(ex.map(lambda t: _thread(cache, p, t), range(N_THREAD)))
        out.put((p, 'ok', cache.stats))
        cache.close()
    except BaseException:
        out.put((p, 'error', traceback.format_exc()))


def test_processes_share_one_file(tmp_path):
    path = tmp_path / 'shared' / 'responses.sqlite'
    ctx = mp.get_context('spawn')
    start, out = ctx.Barrier(N_PROC), ctx.Queue()
    procs = [ctx.Process(target=_process, args=(str(path), p, start, out)) for p in range(N_PROC)]
    for pr in procs: pr.start()
    try: results = sorted(out.get(timeout=120) for _ in procs)
    finally:
        for pr in procs: pr.join(30)
    errors = [r[2] for r in results if r[1] != 'ok']
    assert not errors, errors[0]
    assert [pr.exitcode for pr in procs] == [0] * N_PROC
    stats = [r[2] for r in results]
    assert sum(s['writes'] for s in stats) == N_PROC * N_THREAD * (N_OWN + N_SHARED)
    assert sum(s['corrupted'] for s in stats) == 0

    names = [n for p in range(N_PROC) for t in range(N_THREAD) for n in own_names(p, t)] + SHARED
    assert len(set(names)) == N_PROC * N_THREAD * N_OWN + N_SHARED == 1620
    with ResponseCache(path) as cache:
        assert len(cache) == len(names)
        assert all(cache.get(request(n)) == value(n) for n in names)
        assert cache.stats['corrupted'] == 0
        cache.check()
    raw = sqlite3.connect(path)
    assert raw.execute('SELECT count(*), count(DISTINCT key) FROM responses').fetchone() == (1620, 1620)
    assert {k for (k,) in raw.execute('SELECT key FROM responses')} == {request_key(request(n)) for n in names}
    raw.close()


def _forked(cache, out):
    try:
        fresh = cache.stats                   # counters start at zero in the child
        got = cache.get(request('parent'))
        cache.put(request('child'), value('child'))
        out.put(('ok', got, fresh, len(cache._inherited)))
    except BaseException:
        out.put(('error', traceback.format_exc(), None, None))


@pytest.mark.skipif('fork' not in mp.get_all_start_methods(), reason='no fork on this platform')
def test_forked_child_opens_its_own_connection(tmp_path):
    cache = ResponseCache(tmp_path / 'f.sqlite')
    cache.put(request('parent'), value('parent'))
    ctx = mp.get_context('fork')
    out = ctx.Queue()
    pr = ctx.Process(target=_forked, args=(cache, out))
    pr.start()
    status, got, fresh, inherited = out.get(timeout=30)
    pr.join(30)
    assert status == 'ok', got
    assert got == value('parent')
    assert fresh == {'hits': 0, 'misses': 0, 'corrupted': 0, 'writes': 0}
    assert inherited == 1                     # the parent's connection was set aside, not used
    assert cache.get(request('child')) == value('child')     # the parent's connection still works
    assert cache.stats == {'hits': 1, 'misses': 0, 'corrupted': 0, 'writes': 1}
    cache.close()


def test_pickled_cache_reopens(tmp_path):
    cache = ResponseCache(tmp_path / 'p.sqlite', timeout=7)
    cache.put(request('a'), value('a'))
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.path, copy.timeout) == (cache.path, 7.0)
    assert copy.get(request('a')) == value('a')
    copy.close(); cache.close()


def _real_cache(path, n=2000):
    with ResponseCache(path) as c:
        for i in range(n): c.put(request(f'k{i}'), {'text': 'x' * 200})
    return path.read_bytes()


@pytest.mark.parametrize('damage', ['half', 'last-page', 'first-page', 'header', 'magic', 'garbage', 'zeros'])
def test_damaged_file_fails_clearly(tmp_path, damage):
    data = _real_cache(tmp_path / 'good.sqlite')
    bad = {'half': data[:len(data) // 2], 'last-page': data[:-4096], 'first-page': data[:4096],
           'header': data[:50], 'magic': data[:10], 'garbage': b'\x00\x01 not a database \xff' * 1000,
           'zeros': bytes(8192)}[damage]
    path = tmp_path / 'bad.sqlite'
    path.write_bytes(bad)
    with pytest.raises(CacheError) as e: ResponseCache(path)
    msg = str(e.value)
    assert msg.startswith(f'{path}: not a memlab response cache: '), msg
    assert isinstance(e.value.__cause__, sqlite3.DatabaseError)
    assert path.read_bytes() == bad           # nothing was written over it


def test_foreign_or_newer_file_fails_clearly(tmp_path):
    other = tmp_path / 'other.db'
    con = sqlite3.connect(other); con.execute('CREATE TABLE responses(key, value)'); con.commit(); con.close()
    with pytest.raises(CacheError, match=r"other\.db: not a memlab response cache: it holds the tables \['responses'\]"):
        ResponseCache(other)
    newer = tmp_path / 'newer.sqlite'
    ResponseCache(newer).close()
    con = sqlite3.connect(newer); con.execute("UPDATE meta SET value='99' WHERE name='schema'"); con.commit(); con.close()
    with pytest.raises(CacheError, match=r"newer\.sqlite: memlab response cache schema '99'"): ResponseCache(newer)
