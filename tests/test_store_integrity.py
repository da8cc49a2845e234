"""Results you can trust: one writer per store, readers that never double count, errors that stay errors and can be
retried, interrupts and crashes that leave nothing behind, damaged stores that stay usable.

Every case was found by trying memlab from outside; each test here failed on the code before the fix. They use real
`memlab` processes (and the loopback OpenAI server, 127.0.0.1 only) with bounded waits; every process group started
here is killed in a `finally`.
"""
import json, os, random, shutil, signal, subprocess, sys, time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import given, settings, HealthCheck, strategies as st

from loopback import LoopbackServer
from memlab.core import Rollout, Score, Trajectory, Step, Usage
from memlab.runner import ResultsStore, RunConfig, results_frame

MEMLAB = str(Path(sys.executable).with_name('memlab'))
WAIT = 120


def env(tmp: Path, **extra) -> dict:
    return dict(os.environ, MEMLAB_PROGRESS='0', MEMLAB_CACHE=str(tmp / 'cache.sqlite'), **extra)

def config(tmp: Path, name='trust', n_inst=6, n_q=8, tiers=('weak', 'strong'), **kw) -> Path:
    cfg = dict(name=name, section='trust',
               dataset={'kind': 'synthetic', 'params': {'n_instances': n_inst, 'queries_per_instance': n_q, 'n_filler': 30, 'seed': 5}},
               policies=[{'name': 'offline-reader', 'tier': t} for t in tiers],
               memories=[{'name': 'bm25', 'k': 12}, {'name': 'long-context', 'window_tokens': 2000}], **kw)
    p = tmp / f'{name}.yaml'; p.write_text(yaml.safe_dump(cfg)); return p

def memlab(*args, tmp: Path, timeout=WAIT, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([MEMLAB, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env(tmp), **kw)

class Group:
    "memlab processes started in their own sessions; `close` kills every group still alive."
    def __init__(self): self.procs = []
    def start(self, *args, tmp: Path) -> subprocess.Popen:
        p = subprocess.Popen([MEMLAB, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env(tmp), start_new_session=True)
        self.procs.append(p); return p
    def close(self):
        for p in self.procs:
            try: os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError): pass
            try: p.communicate(timeout=10)
            except subprocess.TimeoutExpired: pass

@pytest.fixture
def group():
    g = Group(); yield g; g.close()

def session_members(sid: int) -> list[int]:
    "PIDs of live processes in session `sid` (a runner started with start_new_session and everything it spawned)."
    out = []
    for d in Path('/proc').iterdir():
        if not d.name.isdigit(): continue
        try: stat = (d / 'stat').read_text()
        except OSError: continue
        fields = stat[stat.rindex(')') + 2:].split()
        if fields[0] != 'Z' and int(fields[3]) == sid: out.append(int(d.name))
    return out

def wait_for(pred, timeout=60.0, step=0.02):
    t = time.monotonic() + timeout
    while time.monotonic() < t:
        if pred(): return True
        time.sleep(step)
    return False

def n_rows(store: Path, kind='rollouts') -> int:
    return sum(len(pd.read_parquet(f)) for f in (store / kind).glob('part-*.parquet')) if (store / kind).is_dir() else 0


# ---------------------------------------------------------------------------------------- 1. one writer per store
def test_two_concurrent_runs_one_writer(tmp_path, group):
    cfg, store = config(tmp_path, n_inst=100), tmp_path / 'store'    # about 10 s: the second run starts while it runs
    a = group.start('run', cfg, '--store', store, tmp=tmp_path)
    assert wait_for(lambda: (store / '.lock').exists() and (store / '.lock').read_text().strip()), 'the first run never took the lock'
    b = group.start('run', cfg, '--store', store, tmp=tmp_path)
    out_b, err_b = b.communicate(timeout=WAIT)
    out_a, err_a = a.communicate(timeout=WAIT)
    assert a.returncode == 0, err_a
    assert b.returncode == 2, (out_b, err_b)
    assert err_b.count('\n') == 1 and f'pid {a.pid} on ' in err_b and 'another writer holds this store' in err_b
    ro = ResultsStore(store).rollouts(history=True)
    assert len(ro) == ro['rollout_id'].nunique() == 100 * 8 * 2 * 2

def test_run_and_resume_with_wait_never_duplicate(tmp_path, group):
    cfg, store = config(tmp_path, n_inst=40), tmp_path / 'store'
    a = group.start('run', cfg, '--store', store, tmp=tmp_path)
    wait_for(lambda: (store / 'manifest.json').exists())    # a resume before the run has begun has nothing to resume (exit 2)
    b = group.start('resume', cfg, '--store', store, '--wait', tmp=tmp_path)
    for p in (a, b):
        _, err = p.communicate(timeout=WAIT); assert p.returncode == 0, err
    assert n_rows(store) == 40 * 8 * 2 * 2                  # raw rows: nothing written twice

def test_concurrent_scores_one_writer(tmp_path, group):
    cfg, store = config(tmp_path, n_inst=12), tmp_path / 'store'
    assert memlab('run', cfg, '--store', store, tmp=tmp_path).returncode == 0
    ps = [group.start('score', store, '--wait', tmp=tmp_path) for _ in range(2)]
    for p in ps:
        _, err = p.communicate(timeout=WAIT); assert p.returncode == 0, err
    assert n_rows(store, 'scores') == 12 * 8 * 2 * 2
    rep = memlab('report', store, tmp=tmp_path)
    assert rep.returncode == 0 and ' 96 ' in rep.stdout        # n = 12 x 8 queries per cell, not twice that

def test_readers_count_duplicates_once_and_say_so(tmp_path):
    cfg, store = config(tmp_path), tmp_path / 'store'
    assert memlab('run', cfg, '--store', store, '--score', tmp=tmp_path).returncode == 0
    before = memlab('report', store, tmp=tmp_path).stdout
    for kind in ('rollouts', 'scores'):                      # what two unlocked writers left behind
        for f in list((store / kind).glob('part-*.parquet')): shutil.copy(f, f.with_name(f.name.replace('part-', 'part-9')))
    assert n_rows(store) == 2 * 6 * 8 * 2 * 2
    rep = memlab('report', store, tmp=tmp_path)
    assert rep.returncode == 0 and rep.stdout == before
    assert 'duplicate row(s)' in rep.stderr and 'counted once' in rep.stderr
    assert len(results_frame(store)) == 6 * 8 * 2 * 2

def test_manifest_writes_are_atomic(tmp_path):
    store = ResultsStore(tmp_path / 'store'); store.write_manifest({'config_hash': 'x', 'i': 0})
    code = ('import sys\nfrom memlab.runner import ResultsStore\ns = ResultsStore(sys.argv[1])\n'
            'for i in range(300): s.write_manifest({"config_hash": "x", "i": i, "pad": "y" * 5000})\n')
    ws = [subprocess.Popen([sys.executable, '-c', code, str(store.root)]) for _ in range(2)]
    bad = reads = 0
    try:
        while any(w.poll() is None for w in ws):
            try: json.loads(store.manifest_path.read_text())
            except ValueError: bad += 1
            reads += 1
    finally:
        for w in ws: w.wait(timeout=WAIT)
    assert [w.returncode for w in ws] == [0, 0] and reads > 100 and bad == 0
    assert not list(store.root.glob('*.tmp'))


# ---------------------------------------------------------------------------------- 2. errors stay errors
rollout_strategy = st.builds(
    lambda i, ans, err, calls: Rollout(rollout_id=f'r{i}', run_id='p', config_hash='h', section='s', dataset='d', instance_id='i',
                                       query_id=f'q{i}', policy='p', policy_label='l', memory='m', memory_family='flat', k=None if calls % 2 else 12,
                                       answer=ans, error=err, n_calls=calls,
                                       trajectory=Trajectory(steps=[Step(kind='answer', answer=ans, usage=Usage(calls=calls))])),
    st.integers(0, 10**6), st.one_of(st.none(), st.text(max_size=20)), st.one_of(st.none(), st.text(min_size=1, max_size=20)),
    st.integers(0, 5))

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(rollout_strategy, min_size=1, max_size=5), min_size=1, max_size=3))
def test_records_round_trip_through_mixed_shards(tmp_path_factory, shards):
    store = ResultsStore(tmp_path_factory.mktemp('rt'))
    want = {}
    for shard in shards:
        shard = list({r.rollout_id: r for r in shard if r.rollout_id not in want}.values())
        want.update({r.rollout_id: r for r in shard})
        store.write_rollouts(shard)
    got = {r.rollout_id: r for r in store.rollout_records()}
    assert got == want

score_strategy = st.builds(
    lambda i, label, sc, raw, run: Score(rollout_id=f'r{i}', judge='j', judge_model='m', prompt_hash='h', run=run, label=label,
                                         correct={'CORRECT': True, 'WRONG': False}.get(label), score=sc, raw=raw),
    st.integers(0, 10**6), st.sampled_from(['CORRECT', 'WRONG', 'unparsed', 'error']),
    st.one_of(st.none(), st.floats(0, 1)), st.one_of(st.none(), st.text(max_size=20)), st.integers(0, 3))

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(score_strategy, min_size=1, max_size=5), min_size=1, max_size=3))
def test_scores_round_trip_through_mixed_shards(tmp_path_factory, shards):
    store = ResultsStore(tmp_path_factory.mktemp('rs'))
    want = {}
    for shard in shards:
        shard = list({(s.rollout_id, s.run): s for s in shard if (s.rollout_id, s.run) not in want}.values())
        want.update({(s.rollout_id, s.run): s for s in shard})
        store.write_scores(shard)
        store.write_rollouts([Rollout(rollout_id=s.rollout_id, run_id='p', config_hash='h', section='s', dataset='d', instance_id='i',
                                      query_id='q', policy='p', policy_label='l', memory='m', memory_family='flat') for s in shard])
    got = {(s.rollout_id, s.run): s for s in store.score_records()}
    assert got == want

def llm_config(tmp, url, name='llm', **backend) -> Path:
    b = {'name': 'openai', 'model': 'loop-model', 'base_url': url, 'max_attempts': 1, 'timeout': 5, **backend}
    cfg = dict(name=name, section='trust',
               dataset={'kind': 'synthetic', 'params': {'n_instances': 2, 'queries_per_instance': 10, 'n_filler': 10, 'seed': 3}},
               policies=[{'name': 'llm', 'backend': b}], memories=[{'name': 'bm25', 'k': 5}])
    p = tmp / f'{name}.yaml'; p.write_text(yaml.safe_dump(cfg)); return p

def test_mixed_errors_score_report_and_retry(tmp_path):
    with LoopbackServer('openai', fault_rate=0.35, faults=('500',), max_faults_per_body=10**6, seed=2) as srv:
        cfg, store = llm_config(tmp_path, srv.url), tmp_path / 'store'
        r = memlab('run', cfg, '--store', store, '--score', tmp=tmp_path)
        ro = ResultsStore(store).rollouts()
        n_err = int(ro['error'].notna().sum())
        assert 0 < n_err < len(ro) == 20, 'the shard must mix answered and failed rollouts'
        assert r.returncode == 1, r.stderr                          # errors above --max-error-rate 0
        assert f'{n_err} of 20 rollouts ended in an error' in r.stderr and 'first error: LLMError' in r.stderr
        assert 'scored: 20 rollouts' in r.stdout                    # scoring a mixed shard does not crash
        assert memlab('report', store, tmp=tmp_path).returncode == 0
        assert memlab('resume', cfg, '--store', store, '--max-error-rate', '1', tmp=tmp_path).returncode == 0
        n0 = srv.n_requests; srv.fault_rate = 0.0
        r = memlab('resume', cfg, '--store', store, '--max-error-rate', '1', tmp=tmp_path)
        assert r.returncode == 0 and srv.n_requests == n0          # errors are not retried unasked
        r = memlab('resume', cfg, '--store', store, '--retry-errors', '--score', tmp=tmp_path)
        assert r.returncode == 0, r.stderr
        s = ResultsStore(store)
        assert s.rollouts()['error'].isna().all() and len(s.rollouts()) == 20
        hist = s.rollouts(history=True)
        assert len(hist) == 20 + n_err and (hist['attempt'] == 1).sum() == n_err
        rf = results_frame(store)
        assert len(rf) == 20 and rf['correct'].notna().all()

def test_preflight_fails_fast_before_writing(tmp_path):
    import socket
    s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()
    cfg, store = llm_config(tmp_path, f'http://127.0.0.1:{port}/v1'), tmp_path / 'store'
    r = memlab('run', cfg, '--store', store, tmp=tmp_path)
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'connection refused' in r.stderr.lower(), r.stderr
    assert not store.exists()
    cfg2 = tmp_path / 'key.yaml'
    c = yaml.safe_load(cfg.read_text()); c['policies'][0]['backend'] = {'name': 'openai', 'model': 'gpt-4o-mini', 'api_key_env': 'MEMLAB_TEST_UNSET_KEY'}
    cfg2.write_text(yaml.safe_dump(c))
    r = memlab('run', cfg2, '--store', store, tmp=tmp_path)
    assert r.returncode == 2 and 'MEMLAB_TEST_UNSET_KEY' in r.stderr and r.stderr.count('\n') == 1 and not store.exists()

def test_judge_provenance(tmp_path):
    with LoopbackServer('openai') as srv:
        cfg, store = config(tmp_path, n_inst=2, n_q=4, tiers=('strong',)), tmp_path / 'store'
        assert memlab('run', cfg, '--store', store, tmp=tmp_path).returncode == 0
        def judge_with(model, runs=1):
            from memlab.runner import score, load_dataset
            c = RunConfig.load(cfg)
            return score(store, load_dataset(c.dataset), judge={'name': 'llm-a3', 'backend': {'name': 'openai', 'model': model, 'base_url': srv.url,
                                                                                            'cache': False}}, n_runs=runs)
        judge_with('judge-a'); n1 = srv.n_requests
        judge_with('judge-b'); n2 = srv.n_requests
        assert n2 - n1 == 16                                        # a changed judge model is a new scoring pass
        judges = ResultsStore(store).manifest()['judges']
        assert [(j['judge'], j['model'], j['rollouts'], j['runs']) for j in judges] == [('llm-a3', 'judge-a', 16, 1), ('llm-a3', 'judge-b', 16, 1)]
        assert memlab('resume', cfg, '--store', store, '--retry-errors', tmp=tmp_path).returncode == 0
        assert ResultsStore(store).manifest()['judges'] == judges     # resume keeps the judges
        judge_with('judge-a', runs=3)
        assert srv.n_requests - n2 == 32                            # runs 1 and 2 of judge-a only
        j = {x['model']: x for x in ResultsStore(store).manifest()['judges']}
        assert (j['judge-a']['runs'], j['judge-a']['scores'], j['judge-b']['runs']) == (3, 48, 1)
        assert len(ResultsStore(store).scores()) == 16 * 4
        with pytest.raises(ValueError, match='several judges'): results_frame(store)
        assert results_frame(store, judge='llm-a3', judge_model='judge-b')['n_runs'].eq(1).all()


# ---------------------------------------------------------------------------- 3. interrupts and crashes
@pytest.mark.parametrize('sig', [signal.SIGKILL, signal.SIGTERM])
def test_no_worker_outlives_the_runner(tmp_path, group, sig):
    cfg, store = config(tmp_path, n_inst=10), tmp_path / 'store'
    rng = random.Random(7 + sig)
    for delay in [0.3, rng.uniform(1.5, 4.0)]:                   # during worker start-up (imports) and during the grid
        p = group.start('run', cfg, '--store', store, '--executor', 'processes', '--workers', '2', tmp=tmp_path)
        assert wait_for(lambda: len(session_members(p.pid)) >= 2, timeout=30), 'no worker started'
        time.sleep(delay)
        p.send_signal(sig); p.communicate(timeout=WAIT)
        assert wait_for(lambda: not session_members(p.pid), timeout=30), f'survivors after {delay:.1f}s: {session_members(p.pid)}'

def test_ctrl_c_keeps_finished_serial_rollouts(tmp_path, group):
    store_sizes = []
    for trial in range(2):
        cfg, store = config(tmp_path, name=f'int{trial}', n_inst=30, n_q=10), tmp_path / f'store{trial}'
        p = group.start('run', cfg, '--store', store, tmp=tmp_path)
        assert wait_for(lambda: n_rows(store) >= 50, timeout=60)
        time.sleep(random.Random(trial).uniform(0.05, 0.5))
        p.send_signal(signal.SIGINT); _, err = p.communicate(timeout=WAIT)
        assert p.returncode == 130 and 'interrupted' in err, err
        assert not list(store.rglob('*.tmp'))
        store_sizes.append(n_rows(store))
        r = memlab('resume', cfg, '--store', store, tmp=tmp_path); assert r.returncode == 0, r.stderr
        assert n_rows(store) == 30 * 10 * 4 and ResultsStore(store).rollouts()['rollout_id'].is_unique
    assert all(n >= 50 for n in store_sizes), store_sizes      # what was on disk before the signal stays

def test_interrupt_keeps_the_partial_buffer(tmp_path):
    "An interrupt between units writes the rollouts still in the buffer (not only whole shards of `flush_every`)."
    from memlab.runner import run, default_history, load_dataset
    cfg = RunConfig.load(config(tmp_path, n_inst=10, n_q=10))
    instances, calls = load_dataset(cfg.dataset), []
    def history(inst, cond):                                   # Ctrl-C as the 5th unit starts: 4 units finished
        calls.append(inst.id)
        if len(calls) == 5: raise KeyboardInterrupt
        return default_history(inst, cond)
    with pytest.raises(KeyboardInterrupt): run(cfg, instances, tmp_path / 'store', history=history, flush_every=50, progress=False)
    per_unit = 10 * len(cfg.policies) * cfg.samples
    assert (4 * per_unit) % 50, 'the case must leave a partial buffer'
    assert n_rows(tmp_path / 'store') == 4 * per_unit

def test_sigint_processes_run_keeps_finished_units(tmp_path, group):
    "Ctrl-C stops a processes run at once: finished units are written, queued ones cancelled (no run to the end unsaved)."
    cfg, store = config(tmp_path, n_inst=150, n_q=4), tmp_path / 'store'      # 300 units: about a minute of work
    p = group.start('run', cfg, '--store', store, '--executor', 'processes', '--workers', '2', tmp=tmp_path)
    assert wait_for(lambda: n_rows(store) >= 32, timeout=90)
    t = time.monotonic(); p.send_signal(signal.SIGINT); _, err = p.communicate(timeout=WAIT)
    stopped = time.monotonic() - t
    assert p.returncode == 130 and 'interrupted' in err, err
    kept = n_rows(store)
    assert kept % 8 == 0 and kept < 150 * 4 * 4                  # whole units (4 queries x 2 tiers), none torn
    assert stopped < 30, f'the runner went on for {stopped:.0f} s after Ctrl-C'   # before: it ran the whole queue, then dropped it
    assert wait_for(lambda: not session_members(p.pid), timeout=30)
    assert memlab('resume', cfg, '--store', store, tmp=tmp_path).returncode == 0
    assert n_rows(store) == 150 * 4 * 4 and ResultsStore(store).rollouts()['rollout_id'].is_unique

class _Synchronous(__import__('concurrent.futures').futures.Executor):
    "An executor that runs each unit at submit time: every unit has finished before the runner reads the first one."
    def submit(self, fn, *args, **kw):
        from concurrent.futures import Future
        f = Future(); f.set_result(fn(*args, **kw)); return f

class _InterruptedStore(ResultsStore):
    "Ctrl-C arrives while the first shard is being written."
    def write_rollouts(self, rollouts):
        first = not (self.root / 'rollouts').is_dir()
        super().write_rollouts(rollouts)
        if first and rollouts: signal.raise_signal(signal.SIGINT)

def test_interrupt_keeps_every_finished_unit(tmp_path):
    "Units that finished before Ctrl-C are all written (before: every finished unit but the one being written was dropped)."
    from memlab.runner import run, load_dataset
    c = RunConfig.load(config(tmp_path, n_inst=5, n_q=3))
    insts = load_dataset(c.dataset)
    store = _InterruptedStore(tmp_path / 'store')
    with pytest.raises(KeyboardInterrupt): run(c, insts, store, executor=_Synchronous(), progress=False)
    assert len(ResultsStore(store.root).rollouts()) == 5 * 3 * 2 * 2     # all 10 units, though interrupted at the first

def test_next_writer_removes_leftover_temp_files(tmp_path):
    cfg, store = config(tmp_path), tmp_path / 'store'
    assert memlab('run', cfg, '--store', store, tmp=tmp_path).returncode == 0
    junk = [store / 'rollouts' / '.part-1-x.parquet.123.tmp', store / 'rollouts' / '.part-2-y.parquet.tmp', store / '.manifest.9.ab.tmp',
            store / 'memories' / 'x' / '.ck.abc.tmp']
    for j in junk: j.parent.mkdir(parents=True, exist_ok=True); j.write_bytes(b'PAR1 half a shard')
    assert memlab('resume', cfg, '--store', store, '--retry-errors', tmp=tmp_path).returncode == 0   # nothing to do: reads only
    assert memlab('score', store, tmp=tmp_path).returncode == 0                                       # writes: cleans up
    assert not [j for j in junk if j.exists()]


def _mount_tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)], capture_output=True, text=True)
    if r.returncode: pytest.skip(f'cannot mount a tmpfs here ({r.stderr.strip()})')

def test_full_disk_and_read_only_store(tmp_path):
    mnt = tmp_path / 'mnt'; _mount_tmpfs(mnt, '160k')
    try:
        cfg = config(tmp_path, n_inst=20, n_q=10)
        r = memlab('run', cfg, '--store', mnt / 'full', tmp=tmp_path)
        assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'No space left on device' in r.stderr and str(mnt) in r.stderr, r.stderr
        s = ResultsStore(mnt / 'full')
        kept = n_rows(s.root)
        assert kept > 0 and not list(s.root.rglob('*.tmp'))          # earlier shards intact, no half-written file
        assert s.manifest()['config_hash'] == RunConfig.load(cfg).config_hash
        shutil.rmtree(s.root)
        big = tmp_path / 'big'; big.write_bytes(b'x')
        subprocess.run(['dd', 'if=/dev/zero', f'of={mnt}/filler', 'bs=1k', 'count=400'], capture_output=True)
        r = memlab('run', cfg, '--store', mnt / 'new', tmp=tmp_path)
        assert r.returncode == 2 and r.stderr.count('\n') == 1, r.stderr
        assert not (mnt / 'new' / 'manifest.json').exists()          # no manifest for work that was not written
        (mnt / 'filler').unlink(); shutil.rmtree(mnt / 'new', ignore_errors=True)
        small = config(tmp_path, name='small', n_inst=2, n_q=3)
        assert memlab('run', small, '--store', mnt / 'ro', '--score', tmp=tmp_path).returncode == 0
        subprocess.run(['mount', '-o', 'remount,ro', str(mnt)], check=True)
        rep = memlab('report', mnt / 'ro', tmp=tmp_path)
        assert rep.returncode == 0 and 'offline reader' in rep.stdout, rep.stderr
        for args in (('resume', small, '--store', mnt / 'ro'), ('score', mnt / 'ro'), ('run', small, '--store', mnt / 'ro', '--retry-errors')):
            r = memlab(*args, tmp=tmp_path); assert r.returncode == 0, (args, r.stderr)
        r = memlab('score', mnt / 'ro', '--runs', '2', tmp=tmp_path)
        assert r.returncode == 2 and 'Read-only file system' in r.stderr and r.stderr.count('\n') == 1, r.stderr
    finally:
        subprocess.run(['umount', '-l', str(mnt)], capture_output=True)

def test_damaged_store_stays_usable(tmp_path):
    cfg, store = config(tmp_path), tmp_path / 'store'
    assert memlab('run', cfg, '--store', store, '--score', tmp=tmp_path).returncode == 0
    before = memlab('report', store, tmp=tmp_path).stdout
    (store / 'rollouts' / 'part-0-empty.parquet').write_bytes(b'')
    good = sorted((store / 'scores').glob('part-*.parquet'))[0]
    (store / 'scores' / 'part-0-trunc.parquet').write_bytes(good.read_bytes()[:200])
    pd.DataFrame({'x': [1, 2]}).to_parquet(store / 'rollouts' / 'part-0-foreign.parquet')
    rep = memlab('report', store, tmp=tmp_path)
    assert rep.returncode == 0 and rep.stdout == before
    for name in ('part-0-empty', 'part-0-trunc', 'part-0-foreign'): assert name in rep.stderr
    store.joinpath('manifest.json').write_text('{"config_hash": "abc", trunc')
    r = memlab('score', store, tmp=tmp_path)
    assert r.returncode == 2 and 'damaged manifest' in r.stderr and r.stderr.count('\n') == 1
    chk = memlab('check', store, tmp=tmp_path)
    assert chk.returncode == 1 and all(n in chk.stdout for n in ('part-0-empty', 'part-0-trunc', 'part-0-foreign', 'manifest.json'))
    r = memlab('resume', cfg, '--store', store, tmp=tmp_path)       # a damaged manifest is set aside and rewritten
    assert r.returncode == 0, r.stderr
    assert ResultsStore(store).manifest()['config_hash'] == RunConfig.load(cfg).config_hash
    assert memlab('check', store, '--quarantine', tmp=tmp_path).returncode == 0
    assert memlab('check', store, tmp=tmp_path).stdout.strip().endswith('no problems found')
    assert len(list((store / 'quarantine').iterdir())) == 4

def test_store_without_manifest_refuses_another_run(tmp_path):
    cfg, store = config(tmp_path), tmp_path / 'store'
    assert memlab('run', cfg, '--store', store, tmp=tmp_path).returncode == 0
    (store / 'manifest.json').unlink()
    other = tmp_path / 'other.yaml'                              # same name, another dataset
    other.write_text(cfg.read_text().replace('n_instances: 6', 'n_instances: 3'))
    r = memlab('run', other, '--store', store, tmp=tmp_path)
    assert r.returncode == 2 and 'another config' in r.stderr, r.stderr
    assert len(ResultsStore(store).rollouts()) == 6 * 8 * 2 * 2
    r = memlab('resume', cfg, '--store', store, tmp=tmp_path)
    assert r.returncode == 0 and ResultsStore(store).manifest()['config_hash'] == RunConfig.load(cfg).config_hash


# ---------------------------------------------------------------------------------------------- 5. secrets
def test_echoed_key_never_reaches_the_store(tmp_path):
    "A server that quotes the key in its 401/500 bodies: the key is in no rollout, score, manifest, cache or output."
    fake = 'sk-memlab-store-echo-7c1d0a99e3'
    with LoopbackServer('openai', fault_rate=0.5, faults=('500', '401'), max_faults_per_body=10**6, echo_auth=True, seed=4) as srv:
        cfg = llm_config(tmp_path, srv.url, api_key_env='MEMLAB_ECHO_CRED')
        c = yaml.safe_load(cfg.read_text())
        c['judge'] = {'name': 'llm-a3', 'backend': {'name': 'openai', 'model': 'loop-judge', 'base_url': srv.url,
                                                    'api_key_env': 'MEMLAB_ECHO_CRED', 'max_attempts': 1}}
        cfg.write_text(yaml.safe_dump(c))
        store = tmp_path / 'store'
        r = subprocess.run([MEMLAB, 'run', cfg, '--store', store, '--score', '--no-preflight'], capture_output=True, text=True,
                           timeout=WAIT, env=env(tmp_path, MEMLAB_ECHO_CRED=fake))
        assert any(fake in (h.get('authorization') or '') for h in srv.headers), 'the key was never sent: the test proves nothing'
    ro, sc = ResultsStore(store).rollouts(), ResultsStore(store).scores()
    assert ro['error'].str.contains('received credentials').any(), 'no echoed error was stored: the test proves nothing'
    assert sc['raw'].fillna('').str.contains('received credentials').any(), 'no echoed judge reply was stored'
    leaks = [str(f) for f in tmp_path.rglob('*') if f.is_file() and fake.encode() in f.read_bytes()]
    assert not leaks and fake not in r.stdout + r.stderr, leaks
    assert ro['error'].str.contains(r'\[REDACTED:MEMLAB_ECHO_CRED\]').any()
