"""A real Dask cluster, not only `LocalCluster`: `dask scheduler` and two `dask worker` processes on 127.0.0.1.

The module fixture starts one scheduler (`--scheduler-file` in a tmp dir, no dashboard) and two workers without a
nanny (`--no-nanny`: a worker killed with -9 stays dead, so the run must finish on the survivor), each in its own
session, from the same venv (workers import memlab). `memlab run CONFIG --executor dask --dask-address tcp://...`
then runs synthetic grids (two reader tiers x two memories, the offline reader) and the same config serially:

* a small grid: the cluster store holds the serial store's rollout records (timings aside), each rollout id once;
* a larger grid (60 units, about 15 s serially): once a third of the units have finished on the cluster (their
  results held on the workers) or rollouts are stored, the busy worker holding most results is SIGKILLed (its held
  results are lost and must be recomputed, its running and queued units rescheduled); the run still exits 0 with
  the serial run's rollout ids, none duplicated (every parquet row counted, every attempt), no error rows, and
  identical records. (The runner submits every unit before it writes any, and tokenizing each ~1 MB instance makes
  submission the bottleneck, so the kill lands while units are still being submitted and none are stored yet.)

Every subprocess wait has a timeout; every process started here is killed by pid in a `finally` and checked dead.
"""
import json, os, signal, subprocess, sys, time
from pathlib import Path

import pandas as pd
import pytest
import yaml

pytest.importorskip('distributed')
from distributed import Client

from memlab.runner import ResultsStore
import cloudpickle
cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the scheduler runs `task_counts` without importing this file

BIN = Path(sys.executable).parent
MEMLAB, DASK = str(BIN / 'memlab'), str(BIN / 'dask')
ENV = dict(os.environ, MEMLAB_PROGRESS='0')
WAIT = 240     # seconds: upper bound on any subprocess wait (never asserted as a duration)
TIERS, MEMORIES = ('weak', 'strong'), ({'name': 'bm25', 'k': 12}, {'name': 'long-context', 'window_tokens': 2000})

def config(name, n_inst, n_q, n_filler):
    return dict(name=name, section='reliability',
                dataset={'kind': 'synthetic', 'params': {'n_instances': n_inst, 'queries_per_instance': n_q,
                                                         'n_filler': n_filler, 'seed': 7}},
                policies=[{'name': 'offline-reader', 'tier': t} for t in TIERS], memories=list(MEMORIES),
                conditions=[{}], samples=1)

SMALL = config('dask-small', 4, 5, 20)           # 4 x 5 x 2 x 2 = 80 rollouts in 8 units
LARGE = config('dask-kill', 30, 16, 1500)        # 30 x 16 x 2 x 2 = 1,920 rollouts in 60 units
def units(cfg): return cfg['dataset']['params']['n_instances'] * len(MEMORIES)
def total(cfg): p = cfg['dataset']['params']; return p['n_instances'] * p['queries_per_instance'] * len(TIERS) * len(MEMORIES)


# ------------------------------------------------------------------------------------------------ helpers
def alive(pid: int) -> bool:
    "The process exists and is not a zombie."
    try: st = Path(f'/proc/{pid}/stat').read_text()
    except FileNotFoundError: return False
    return st.rsplit(')', 1)[1].split()[0] != 'Z'

class Procs:
    "Subprocesses in their own sessions, logs in a folder; `close` SIGKILLs each group by pid and reaps it."
    def __init__(self, logdir: Path): self.logdir, self.started = logdir, []

    def start(self, *argv) -> subprocess.Popen:
        i = len(self.started)
        out, err = open(self.logdir / f'{i}.out', 'w'), open(self.logdir / f'{i}.err', 'w')
        p = subprocess.Popen([*map(str, argv)], stdout=out, stderr=err, env=ENV, start_new_session=True,
                             cwd=self.logdir)
        p.logs = (out, err, self.logdir / f'{i}.out', self.logdir / f'{i}.err')
        self.started.append(p)
        return p

    def output(self, p) -> str:
        for f in p.logs[:2]: f.flush()
        return p.logs[2].read_text()[-3000:] + p.logs[3].read_text()[-3000:]

    def close(self):
        for p in self.started:
            try: os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError): pass
            try: p.wait(timeout=10)
            except subprocess.TimeoutExpired: pass
            for f in p.logs[:2]: f.close()

def workers(client) -> set:
    "The addresses of the workers the scheduler knows."
    return set(client.scheduler_info(n_workers=-1)['workers'])

def memlab_run(procs, cfg_path, store, *extra):
    "`memlab run` to completion (bounded); returns its output, failing on a non-zero exit."
    p = procs.start(MEMLAB, 'run', cfg_path, '--store', store, *extra)
    try: rc = p.wait(timeout=WAIT)
    except subprocess.TimeoutExpired: pytest.fail(f'memlab run {extra} did not finish in {WAIT} s:\n{procs.output(p)}')
    assert rc == 0, f'memlab run {extra} exited {rc}:\n{procs.output(p)}'
    return procs.output(p)

def task_counts(dask_scheduler) -> dict:
    "On the scheduler: units submitted so far, units finished, and per worker address the results it holds and the units it runs."
    ts = list(dask_scheduler.tasks.values()); held, running = {}, {}
    for t in ts:
        for w in t.who_has or (): held[w.address] = held.get(w.address, 0) + 1
        if t.processing_on is not None: running[t.processing_on.address] = running.get(t.processing_on.address, 0) + 1
    return dict(total=len(ts), done=sum(t.state == 'memory' for t in ts), held=held, processing=running)

def write_cfg(d: Path, cfg) -> Path:
    p = d / f'{cfg["name"]}.yaml'; p.write_text(yaml.safe_dump(cfg, sort_keys=False)); return p

def records(store) -> dict:
    "rollout_id -> the stored record without timings (`timings`, each step's `memory_s`: all that may differ between executors)."
    out = {}
    for r in ResultsStore(store).rollout_records():
        d = r.model_dump(mode='json', exclude={'timings'})
        for s in d['trajectory']['steps']: s.pop('memory_s', None)
        out[r.rollout_id] = d
    return out

def raw_ids(store) -> pd.Series:
    "Every rollout id as written, one per parquet row of every shard and attempt (the store's reader drops duplicates)."
    fs = sorted((Path(store) / 'rollouts').glob('part-*.parquet'))
    return pd.concat([pd.read_parquet(f, columns=['rollout_id']) for f in fs])['rollout_id'] if fs else pd.Series([], dtype=object)


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    "One `dask scheduler` and two `dask worker --no-nanny` processes on 127.0.0.1; yields (address, procs, client)."
    d = tmp_path_factory.mktemp('cluster'); sf = d / 'scheduler.json'
    procs = Procs(d); client = None
    try:
        sched = procs.start(DASK, 'scheduler', '--host', '127.0.0.1', '--port', '0', '--no-dashboard',
                            '--scheduler-file', sf)
        for _ in range(600):                        # the file appears once the scheduler listens
            if sf.exists() and sf.stat().st_size: break
            assert sched.poll() is None, f'dask scheduler exited:\n{procs.output(sched)}'
            time.sleep(0.1)
        address = json.loads(sf.read_text())['address']
        assert address.startswith('tcp://127.0.0.1:')
        ws = [procs.start(DASK, 'worker', '--scheduler-file', sf, '--host', '127.0.0.1', '--nthreads', '1',
                          '--no-nanny', '--no-dashboard', '--memory-limit', '0', '--name', f'w{i}',
                          '--local-directory', d / f'w{i}') for i in range(2)]
        client = Client(address, timeout=60)
        client.wait_for_workers(2, timeout=120)
        pids = {pid: a for a, pid in client.run(os.getpid).items()}
        assert set(pids) == {w.pid for w in ws}      # the workers are the processes started here
        yield dict(address=address, procs=procs, client=client, workers=ws, dir=d, pids=pids)
    finally:
        if client is not None: client.close()
        pids = [p.pid for p in procs.started]
        procs.close()
        left = [pid for pid in pids if alive(pid)]
        assert not left, f'orphan cluster processes: {left}'

@pytest.fixture(scope='module')
def large_serial(tmp_path_factory):
    "The larger grid run serially by `memlab run`: the reference of the kill test."
    d = tmp_path_factory.mktemp('serial'); procs = Procs(d)
    try:
        t0 = time.monotonic(); memlab_run(procs, write_cfg(d, LARGE), d / 'store'); wall = time.monotonic() - t0
    finally: procs.close()
    print(f'\nserial memlab run of {total(LARGE)} rollouts: {wall:.1f} s wall')
    return d / 'store'


# ------------------------------------------------------------------------------------------------ tests
def test_cluster_matches_serial(cluster, tmp_path):
    "`memlab run --executor dask --dask-address` on the two-worker cluster stores the serial run's records, each once."
    procs = Procs(tmp_path); cfg = write_cfg(tmp_path, SMALL)
    try:
        memlab_run(procs, cfg, tmp_path / 'serial')
        out = memlab_run(procs, cfg, tmp_path / 'dask', '--executor', 'dask', '--dask-address', cluster['address'])
    finally: procs.close()
    assert f'{total(SMALL)} rollouts' in out and '(0 with errors)' in out, out
    ser, dsk = records(tmp_path / 'serial'), records(tmp_path / 'dask')
    assert len(ser) == total(SMALL) and set(dsk) == set(ser)
    assert dsk == ser
    ids = raw_ids(tmp_path / 'dask')
    assert len(ids) == total(SMALL) and ids.is_unique
    # the units ran on the cluster's workers (both of them), not in the runner's process
    done = cluster['client'].run(lambda dask_worker: dask_worker.state.executed_count)
    assert len(done) == 2 and all(n > 0 for n in done.values()), done

def test_kill_one_worker_mid_run(cluster, large_serial, tmp_path):
    "kill -9 a busy worker once a third of the units have finished: the run completes on the other, nothing lost or duplicated."
    client, procs = cluster['client'], Procs(tmp_path)
    store, n = tmp_path / 'dask', total(LARGE)
    try:
        t0 = time.monotonic()
        p = procs.start(MEMLAB, 'run', write_cfg(tmp_path, LARGE), '--store', store,
                        '--executor', 'dask', '--dask-address', cluster['address'])
        while True:                                 # a third of the units finished (held on the workers) or stored, a worker busy
            try: p.wait(timeout=0.02)               # a pause between snapshots that notices the run ending
            except subprocess.TimeoutExpired: pass
            else: pytest.fail(f'the run ended before the kill (rc={p.returncode}):\n{procs.output(p)}')
            snap = client.run_on_scheduler(task_counts)
            busy = [pid for pid, a in cluster['pids'].items() if snap['processing'].get(a)]
            if busy and (snap['done'] >= units(LARGE) // 3 or raw_ids(store).size): break
        victim = max(busy, key=lambda pid: snap['held'].get(cluster['pids'][pid], 0))   # the one holding most results
        stored_at_kill = raw_ids(store).size
        os.kill(victim, signal.SIGKILL)
        wp = next(w for w in cluster['workers'] if w.pid == victim)
        assert wp.wait(timeout=30) == -signal.SIGKILL
        assert snap['done'] < units(LARGE) and stored_at_kill < n, 'the kill landed after the work was done'
        try: rc = p.wait(timeout=WAIT)
        except subprocess.TimeoutExpired: pytest.fail(f'the run hung after a worker died:\n{procs.output(p)}')
        wall = time.monotonic() - t0
        out = procs.output(p)
    finally: procs.close()
    print(f"\ncluster run of {n} rollouts in {units(LARGE)} units, one worker killed when {snap['total']} were submitted, {snap['done']} done "
          f"({snap['held'].get(cluster['pids'][victim], 0)} results held on it, {snap['processing'][cluster['pids'][victim]]} "
          f"running on it) and {stored_at_kill} rollouts stored: {wall:.1f} s wall")
    assert rc == 0, out
    assert f'{n} rollouts' in out and '(0 with errors)' in out, out
    assert workers(client) == set(cluster['pids'].values()) - {cluster['pids'][victim]}   # it finished on the survivor
    st = ResultsStore(store)
    hist = st.rollouts(history=True)
    assert len(hist) == n and hist['rollout_id'].is_unique and (hist['attempt'] == 0).all()
    assert hist['error'].isna().all()
    ids = raw_ids(store)
    assert len(ids) == n and ids.is_unique                   # no unit written twice, even before de-duplication
    ser, dsk = records(large_serial), records(store)
    assert set(dsk) == set(ser) and len(ser) == n
    assert dsk == ser
