"""kill -9 the runner at random points and resume: the store ends with exactly the grid's rollouts.

A run config of 40 synthetic users x 10 questions x 2 reader tiers x 2 memories (1,600 rollouts, about 5 s for
`memlab run` on one core) is run once uninterrupted into a reference store (`memlab run --score`). Then:

* serial: `memlab run` is started in its own session and SIGKILLed at a random time (seeded RNG); `memlab resume`
  is started and killed the same way until 3 kills have hit a live process; a final `memlab resume` finishes and
  `memlab score` judges. After every kill the store holds a prefix of the grid order (serial runs flush every
  `flush_every` rollouts in plan order), every row is a valid `Rollout`, and there are no duplicates; a leftover
  (garbage) `.part-*.tmp` shard is never read as data.
* processes: the same with `--executor processes --workers 2`, killed once while units are being written.

At the end both stores hold exactly the reference's rollout ids, once each, with identical answers, R(tau),
errors and judged correctness per rollout id, and identical metrics (accuracy and mean n_calls per policy x
memory). Kill times are random but bounded: a kill also fires once the store holds `SAFETY` of the grid, so it
always lands on a live process. Every subprocess wait has a timeout and every process group started here is
killed in a `finally`.
"""
import inspect, json, math, os, random, signal, subprocess, sys, time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from memlab.core import Rollout
from memlab.runner import ResultsStore, results_frame, run as run_fn

MEMLAB = str(Path(sys.executable).with_name('memlab'))
ENV = dict(os.environ, MEMLAB_PROGRESS='0')
N_INST, N_Q, N_FILLER = 40, 10, 100
TIERS, MEMORIES = ('weak', 'strong'), ({'name': 'bm25', 'k': 12}, {'name': 'long-context', 'window_tokens': 2000})
TOTAL = N_INST * N_Q * len(TIERS) * len(MEMORIES)
FLUSH = inspect.signature(run_fn).parameters['flush_every'].default    # serial shard size
SEED = int(os.environ.get('MEMLAB_KILL_SEED', 20240611))     # vary it to explore other kill points
N_KILLS, SAFETY = 3, 0.85
WAIT = 120       # seconds: upper bound on any subprocess wait
PER_ROLLOUT = ['instance_id', 'query_id', 'policy', 'memory', 'sample', 'answer', 'n_calls', 'capped', 'error', 'correct']

CONFIG = dict(name='killtest', section='reliability',
              dataset={'kind': 'synthetic', 'params': {'n_instances': N_INST, 'queries_per_instance': N_Q,
                                                       'n_filler': N_FILLER, 'seed': 7}},
              policies=[{'name': 'offline-reader', 'tier': t} for t in TIERS], memories=list(MEMORIES),
              conditions=[{}], samples=1)


# ------------------------------------------------------------------------------------------------ helpers
class Procs:
    "Start memlab subprocesses in their own sessions; `close` kills every group still alive."
    def __init__(self, logdir: Path): self.logdir, self.started = logdir, []

    def start(self, *args) -> subprocess.Popen:
        i = len(self.started)
        out, err = open(self.logdir / f'{i}.out', 'w'), open(self.logdir / f'{i}.err', 'w')
        p = subprocess.Popen([MEMLAB, *map(str, args)], stdout=out, stderr=err, env=ENV, start_new_session=True)
        p.logs = (out, err, self.logdir / f'{i}.out', self.logdir / f'{i}.err')
        self.started.append(p)
        return p

    def output(self, p) -> str:
        for f in p.logs[:2]: f.flush()
        return p.logs[2].read_text() + p.logs[3].read_text()

    def finish(self, *args) -> str:
        "Run to completion (bounded); returns the output, failing on a non-zero exit."
        p = self.start(*args)
        try: rc = p.wait(timeout=WAIT)
        except subprocess.TimeoutExpired: pytest.fail(f'memlab {args} did not finish in {WAIT} s')
        assert rc == 0, f'memlab {args} exited {rc}:\n{self.output(p)}'
        return self.output(p)

    def close(self):
        for p in self.started:
            try: os.killpg(p.pid, signal.SIGKILL)    # the group: the runner and any pool workers it spawned
            except (ProcessLookupError, PermissionError): pass
            try: p.wait(timeout=10)
            except subprocess.TimeoutExpired: pass
            for f in p.logs[:2]: f.close()


def shards(store: Path) -> list[Path]: return sorted((store / 'rollouts').glob('part-*.parquet'))

def kill_when(procs: Procs, p, store: Path, delay: float, max_shards: int) -> str:
    """SIGKILL `p` after `delay` seconds, or as soon as the store holds `max_shards` shards; asserts it was alive.
    Returns when the kill happened after the start and which trigger fired."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < delay and len(shards(store)) < max_shards:
        assert p.poll() is None, f'the runner ended before its kill (rc={p.returncode}):\n{procs.output(p)}'
        time.sleep(0.005)
    assert p.poll() is None, f'the runner ended before its kill (rc={p.returncode}):\n{procs.output(p)}'
    t = time.monotonic() - t0
    os.kill(p.pid, signal.SIGKILL)
    rc = p.wait(timeout=30)
    assert rc == -signal.SIGKILL, f'expected death by SIGKILL, got rc={rc}:\n{procs.output(p)}'
    return f"{t:.2f}s/{'time' if t >= delay else 'share'}"

def check_partial(store: Path, ref, prefix: bool) -> int:
    "A killed run's store: readable, no duplicates, every row a valid Rollout of the grid; serial: a grid-order prefix."
    ro = ResultsStore(store).rollouts()
    assert not ro['rollout_id'].duplicated().any(), 'duplicate rollout ids after a kill'
    ids = list(ro['rollout_id'])
    assert set(ids) <= ref['ids'], 'rollouts that are not in the grid'
    for row in ro.to_dict('records'):
        r = Rollout.from_row(row)                  # complete and valid
        assert r.error is None and r.answer is not None and r.config_hash == ref['config_hash']
    if prefix:
        assert len(ids) % FLUSH == 0, f'{len(ids)} stored rollouts: not whole serial shards of {FLUSH}'
        assert set(ids) == set(ref['order'][:len(ids)]), 'stored rollouts are not a prefix of the grid order'
    return len(ids)

def metrics(df: pd.DataFrame) -> pd.DataFrame:
    return (df.groupby(['policy', 'memory']).agg(accuracy=('correct', 'mean'), mean_calls=('n_calls', 'mean'),
                                                  n=('rollout_id', 'size')).reset_index())

def per_rollout(df: pd.DataFrame) -> pd.DataFrame:
    return df.set_index('rollout_id').sort_index()[PER_ROLLOUT]

def check_final(store: Path, ref):
    "The resumed store equals the uninterrupted one: same ids once each, same answers, R(tau), correctness, metrics."
    st = ResultsStore(store)
    ro, sc = st.rollouts(), st.scores()
    assert len(ro) == TOTAL and not ro['rollout_id'].duplicated().any()
    assert set(ro['rollout_id']) == ref['ids']
    assert not sc.duplicated(subset=['rollout_id', 'judge', 'run']).any(), 'a rollout was judged twice'
    assert set(sc['rollout_id']) == ref['ids']
    df = results_frame(store)
    assert df['correct'].notna().all() and df['error'].isna().all()
    pd.testing.assert_frame_equal(per_rollout(df), ref['per_rollout'])
    pd.testing.assert_frame_equal(metrics(df), ref['metrics'])
    assert st.manifest()['config_hash'] == ref['config_hash']


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope='module')
def cfg_path(tmp_path_factory):
    p = tmp_path_factory.mktemp('cfg') / 'killtest.yaml'
    p.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    return p

@pytest.fixture(scope='module')
def reference(cfg_path, tmp_path_factory):
    "The uninterrupted run (with --score), its grid order, per-rollout values, metrics and timings."
    root = tmp_path_factory.mktemp('ref'); store = root / 'A'
    procs = Procs(root)
    try:
        t0 = time.monotonic(); p = procs.start('run', cfg_path, '--store', store, '--score')
        t_first = t_last = None; n = 0
        while p.poll() is None and time.monotonic() - t0 < WAIT:
            k = len(shards(store))
            if k != n:
                now = time.monotonic() - t0
                t_first = t_first or now; t_last = now if k == math.ceil(TOTAL / FLUSH) else t_last; n = k
            time.sleep(0.005)
        rc = p.wait(timeout=WAIT)
        assert rc == 0, procs.output(p)
        wall = time.monotonic() - t0
    finally: procs.close()
    st = ResultsStore(store); ro = st.rollouts()
    assert len(ro) == TOTAL and ro['rollout_id'].is_unique and ro['error'].isna().all()
    df = results_frame(store)
    assert df['correct'].notna().all()
    t_last = t_last or wall
    per = max((t_last - t_first) / max(TOTAL - FLUSH, 1), 1e-4)      # seconds per rollout
    startup = max(t_first - FLUSH * per, 0.2)                         # import, dataset, manifest
    print(f'\nreference: {wall:.1f} s wall, startup ~{startup:.1f} s, {per * 1e3:.2f} ms/rollout, {TOTAL} rollouts')
    return dict(store=store, ids=set(ro['rollout_id']), order=list(ro['rollout_id']), per_rollout=per_rollout(df),
                metrics=metrics(df), config_hash=st.manifest()['config_hash'], startup=startup, per=per, wall=wall)


def test_reference_is_sane(reference):
    "The reference itself: the whole grid once, nontrivial metrics (both tiers, both memories, not all correct)."
    m = reference['metrics']
    assert len(m) == len(TIERS) * len(MEMORIES) and (m['n'] == TOTAL // len(m)).all()
    assert 0 < m['accuracy'].min() and m['accuracy'].max() < 1
    assert m['mean_calls'].min() >= 1


# ------------------------------------------------------------------------------------------------ tests
def test_serial_kill9_resume(cfg_path, reference, tmp_path):
    "3 kill -9 at random points of `memlab run`/`memlab resume`, then resume to the end: identical to the reference."
    store, procs = tmp_path / 'B', Procs(tmp_path)
    rng = random.Random(SEED)
    # random points in the grid (fractions of all rollouts) at which to aim the kills, increasing
    targets = sorted(rng.uniform(0.08, 0.75) for _ in range(N_KILLS))
    counts, kill_times, cmds = [0], [], []
    try:
        for target in targets:
            cmd = 'resume' if (store / 'manifest.json').exists() else 'run'   # a kill before the manifest: run again
            gap = target * TOTAL - counts[-1]
            delay = (reference['startup'] + gap * reference['per'] if gap > 0
                     else rng.uniform(0.2, 1.0) * reference['startup'])      # behind already: kill during start-up
            p = procs.start(cmd, cfg_path, '--store', store)
            kill_times.append(kill_when(procs, p, store, delay, max_shards=int(SAFETY * TOTAL) // FLUSH))
            cmds.append(cmd)
            # after each kill: a readable, duplicate-free prefix of the grid; stray temp shards are not data
            counts.append(check_partial(store, reference, prefix=True))
        print(f'\nserial kills (aimed at {[round(t * TOTAL) for t in targets]}): {cmds} at {kill_times}; '
              f'stored after each: {counts[1:]} / {TOTAL}; '
              f'leftover temp shards: {len(list((store / "rollouts").glob(".part-*.tmp")))}')
        assert len(kill_times) == N_KILLS
        assert counts == sorted(counts), f'stored rollouts shrank between kills: {counts}'
        assert any(b > a for a, b in zip(counts, counts[1:])), f'no kill left any rollouts: {counts}'
        assert counts[-1] < TOTAL, 'the run was never actually interrupted'

        # a shard torn by a kill mid-write is left as a hidden temp file: it must never be read as data
        torn = store / 'rollouts' / '.part-0000000000000000001-deadbeef.parquet.tmp'
        torn.parent.mkdir(parents=True, exist_ok=True); torn.write_bytes(b'PAR1 torn shard \x00\x01')
        assert check_partial(store, reference, prefix=True) == counts[-1]

        out = procs.finish('resume', cfg_path, '--store', store)
        assert f'{TOTAL} rollouts' in out and '(0 with errors)' in out, out
        procs.finish('score', store)
    finally: procs.close()
    check_final(store, reference)


def test_processes_kill9_resume(cfg_path, reference, tmp_path):
    "`--executor processes --workers 2`, killed once while units are written, then resumed: identical to the reference."
    store, procs = tmp_path / 'C', Procs(tmp_path)
    rng = random.Random(SEED + 1)
    args = ('--executor', 'processes', '--workers', '2')
    unit = N_Q * len(TIERS)                                   # rollouts per unit = per shard with an executor
    try:
        p = procs.start('run', cfg_path, '--store', store, *args)
        t0 = time.monotonic()
        for _ in range(int(WAIT / 0.005)):                    # wait (a bounded number of polls) until units are being written
            if shards(store): break
            assert p.poll() is None, f'the runner ended before its kill:\n{procs.output(p)}'
            time.sleep(0.005)
        else: raise AssertionError('no shard written')
        t_first = time.monotonic() - t0
        # then a random moment, by time or by the share of the grid stored, whichever comes first
        when = kill_when(procs, p, store, delay=rng.uniform(0.0, 2.0),
                         max_shards=max(2, int(rng.uniform(0.2, 0.7) * TOTAL) // unit))
        n = check_partial(store, reference, prefix=False)
        assert 0 < n < TOTAL and n % unit == 0, n            # whole units only
        ps = subprocess.run(['ps', '-o', 'pid=,stat=', '-s', str(p.pid)], capture_output=True, text=True).stdout.split()
        print(f'\nprocesses: first shard at {t_first:.1f} s, killed {when} later with {n}/{TOTAL} stored; '
              f'{len(ps) // 2} orphaned pool processes left behind')
        out = procs.finish('resume', cfg_path, '--store', store, *args)
        assert f'{TOTAL} rollouts' in out and '(0 with errors)' in out, out
        procs.finish('score', store)
    finally: procs.close()
    check_final(store, reference)
