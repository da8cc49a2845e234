"""A damaged response cache file is set aside, never a rollout error.

A real cache with many entries gets seeded garbage written over pages in the middle of the file, so that
SQLite itself says 'database disk image is malformed' (checked with `sqlite3`). Calls through an
`OpenAIBackend` against the loopback server then all succeed: the broken file is renamed to
`<name>.broken-<time>`, one `CacheWarning` (and one log warning) reports it, a fresh cache file takes its place,
and a rerun is served from that fresh file. `memlab run` with `MEMLAB_CACHE` pointing at such a file finishes
with 0 rollouts in error. A file that is not a memlab cache is still refused (`CacheError`), untouched.
"""
import logging, os, random, re, sqlite3, subprocess, sys, warnings
from pathlib import Path

import pytest
import yaml
from loopback import LoopbackServer, Reply, _user_texts
from memlab.cache import ResponseCache, CacheError, CacheWarning
from memlab.llm import OpenAIBackend
from memlab.runner import ResultsStore

MEMLAB = str(Path(sys.executable).with_name('memlab'))
PAGE = 4096

def echo(kind, req): return Reply(content='echo ' + _user_texts(kind, req)[-1])

def calls(n, start=0):
    return [dict(messages=[{'role': 'user', 'content': f'Question: what is item {i}?'}], max_tokens=16) for i in range(start, start + n)]

def fill(path: Path, n: int=2000):
    "Filler entries, so the file has many b-tree pages and lookups descend through several levels."
    with ResponseCache(path) as c:
        for i in range(n):
            c.put({'provider': 'filler', 'model': 'f', 'messages': [{'role': 'user', 'content': f'filler {i}'}]},
                  {'content': f'filler answer {i} ' + 'x' * 150})

def damage(path: Path, seed: int=0):
    "Seeded random bytes over the middle third of the pages (page 1, the schema, is left alone)."
    data = bytearray(path.read_bytes()); n = len(data) // PAGE
    assert n > 30, n
    rng = random.Random(seed)
    for pg in range(n // 3, 2 * n // 3): data[pg * PAGE:(pg + 1) * PAGE] = rng.randbytes(PAGE)
    path.write_bytes(bytes(data))

def sqlite_says_malformed(path: Path) -> bool:
    con = sqlite3.connect(path)
    try: con.execute('PRAGMA quick_check').fetchall(); return False
    except sqlite3.DatabaseError as e: return 'malformed' in str(e)
    finally: con.close()

def broken_files(path: Path) -> list:
    return sorted(f for f in path.parent.glob(path.name + '.broken-*') if not f.name.endswith(('-wal', '-shm')))


def test_damaged_cache_is_set_aside_and_calls_succeed(tmp_path, caplog):
    path = tmp_path / 'cache' / 'responses.sqlite'
    with LoopbackServer('openai', echo) as srv:
        b0 = OpenAIBackend('loop-model', base_url=srv.url, cache=str(path), timeout=5, backoff=0.01)
        first = b0.chat_many(calls(120))
        assert [r.content for r, _ in first] == [f'echo Question: what is item {i}?' for i in range(120)]
        b0.cache.close()
        fill(path)
        damage(path)
        assert sqlite_says_malformed(path), 'the damage did not make the file malformed: the test would prove nothing'
        n0 = srv.n_requests

        b1 = OpenAIBackend('loop-model', base_url=srv.url, cache=str(path), timeout=5, backoff=0.01)
        with warnings.catch_warnings(record=True) as w, caplog.at_level(logging.WARNING, logger='memlab.cache'):
            warnings.simplefilter('always')
            out = [b1.chat(**kw) for kw in calls(40)] + b1.chat_many(calls(80, start=40))     # threads and coroutines
        assert [r.content for r, _ in out] == [f'echo Question: what is item {i}?' for i in range(120)]   # every call succeeds
        damaged = [x for x in w if issubclass(x.category, CacheWarning)]
        assert len(damaged) == 1, [str(x.message) for x in damaged]                                # reported once
        msg = str(damaged[0].message)
        assert str(path) in msg and 'malformed' in msg and 'set aside' in msg, msg
        assert len([r for r in caplog.records if 'set aside' in r.getMessage()]) == 1
        (broken,) = broken_files(path)
        assert broken.name in msg and sqlite_says_malformed(broken)                                  # the damaged file, kept
        assert path.exists() and not sqlite_says_malformed(path)                                     # a fresh file
        assert srv.n_requests > n0                                                                   # refetched

        old_hits = sum(u.cached for _, u in out)     # read intact from the old file before the damage was met
        assert old_hits < 60, old_hits
        n1 = srv.n_requests                          # a rerun: from the fresh cache (those few hits refetched once)
        again = [b1.chat(**kw) for kw in calls(120)]
        assert srv.n_requests == n1 + old_hits
        b2 = OpenAIBackend('loop-model', base_url=srv.url, cache=str(path), timeout=5, backoff=0.01)
        third = b2.chat_many(calls(120)) + [b1.chat(**kw) for kw in calls(120)]    # a new backend, and this one
        assert srv.n_requests == n1 + old_hits and all(u.cached == 1 for _, u in third)
        assert [r.content for r, _ in again + third] == [r.content for r, _ in out] * 3
    assert b1.cache.incidents['set_aside'] == 1 and len(broken_files(path)) == 1
    other = tmp_path / 'notes.db'                     # a file that is not a memlab cache is still refused, untouched
    con = sqlite3.connect(other); con.execute('CREATE TABLE notes(x)'); con.commit(); con.close()
    text = tmp_path / 'text.sqlite'; text.write_bytes(b'not a database at all\n' * 400)
    before = {f: f.read_bytes() for f in (other, text)}
    for bad in (other, text):
        with pytest.raises(CacheError, match='not a memlab response cache'):
            OpenAIBackend('loop-model', base_url='http://127.0.0.1:9/v1', cache=str(bad))
        assert not broken_files(bad) and bad.read_bytes() == before[bad]


CONFIG = dict(name='damaged-cache', section='reliability',
              dataset={'kind': 'synthetic', 'params': {'n_instances': 4, 'queries_per_instance': 5, 'n_filler': 10, 'seed': 2}},
              memories=[{'name': 'bm25', 'k': 5}], judge={'name': 'offline-match'})

def errors(store: Path) -> list:
    "The error of every rollout in the store that has one (and 20 rollouts in all)."
    ro = ResultsStore(store).rollouts()
    assert len(ro) == 20, len(ro)
    return ro['error'].dropna().tolist()

def memlab_run(cfg: Path, store: Path, cache: Path):
    env = dict(os.environ, MEMLAB_CACHE=str(cache), MEMLAB_PROGRESS='0')
    return subprocess.run([MEMLAB, 'run', str(cfg), '--store', str(store), '--executor', 'threads', '--workers', '4'],
                          capture_output=True, text=True, env=env, timeout=300)

def test_memlab_run_with_damaged_cache_has_no_errors(tmp_path):
    cache = tmp_path / 'cache' / 'responses.sqlite'
    fill(cache)                                       # filler first: the run's own entries land among many pages
    with LoopbackServer('openai') as srv:
        cfg = tmp_path / 'run.yaml'
        backend = {'name': 'openai', 'model': 'loop-model', 'base_url': srv.url, 'timeout': 5, 'backoff': 0.01}
        cfg.write_text(yaml.safe_dump(dict(CONFIG, policies=[{'name': 'llm', 'backend': backend}]), sort_keys=False))
        p = memlab_run(cfg, tmp_path / 'a', cache)
        assert p.returncode == 0 and errors(tmp_path / 'a') == [], p.stdout + p.stderr[-3000:]
        damage(cache, seed=1)
        assert sqlite_says_malformed(cache), 'the damage did not make the file malformed: the test would prove nothing'
        n = srv.n_requests
        p = memlab_run(cfg, tmp_path / 'b', cache)     # a fresh store: every rollout is generated again
        assert errors(tmp_path / 'b') == [], p.stdout + p.stderr[-3000:]     # 0 rollouts with errors
        assert p.returncode == 0, p.stdout + p.stderr[-3000:]
        assert srv.n_requests > n                      # the lost entries were refetched
        named = set(re.findall(r'set aside as (\S+?)[;,: ]', p.stderr))
        assert len(named) == 1, p.stderr[-3000:]       # reported once (a log record and a CacheWarning, same text)
    assert len(broken_files(cache)) == 1 and not sqlite_says_malformed(cache)
