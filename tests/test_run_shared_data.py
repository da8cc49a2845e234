"""A process-pool run sends its history and instances to each worker once, not once per unit (issue 29).

Before: `run` submitted `run_unit(cfg, inst, cond, mspec, todo, history, ...)` per unit, so the history (for a
paper-size scale ladder, its pool: ~30 MB pickled, ~3 s) and the unit's instance were pickled for every one of the
grid's units (5 scales x 4 memories x 500 queries). Now the run pickles `RunData` once into its store
(`share_run_data`), each worker process loads it once, and the file is gone when the run ends. A history that counts
its own pickling in the parent shows it; the stored rollouts equal a serial run's.
"""
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

from memlab.memory import HISTORIES
from memlab.runner import run, RunConfig, ResultsStore
from memlab.synth import make_benchmark

PICKLED = []   # parent-side count: one entry each time the history is pickled


class CountingHistory:
    "Every session of the instance; records each time it is pickled."
    def __call__(self, instance, condition): return list(instance.sessions)
    def info(self): return {'name': 'counting'}
    def __getstate__(self): PICKLED.append(1); return {}


def config(name):
    return RunConfig(name=name, dataset={'kind': 'synthetic'}, policies=[{'name': 'offline-reader', 'tier': 'medium'}],
                     memories=[{'name': 'bm25'}, {'name': 'items'}], conditions=[{'c': 0}, {'c': 1}, {'c': 2}],
                     judge={'name': 'offline-match'})


def frame(store):
    ro = store.rollouts()
    return ro[['rollout_id', 'answer', 'n_calls', 'error']].sort_values('rollout_id').reset_index(drop=True)


def test_process_pool_pickles_the_history_once_and_matches_serial(tmp_path):
    insts = make_benchmark(4, 2, 6, seed=5)
    serial = run(config('shared'), insts, tmp_path / 'serial', history=CountingHistory(), progress=False)
    PICKLED.clear()
    with ProcessPoolExecutor(2, mp_context=mp.get_context('spawn')) as ex:
        pooled = run(config('shared'), insts, tmp_path / 'pool', history=CountingHistory(), executor=ex, progress=False)
    n_units = len(insts) * 3 * 2
    assert len(PICKLED) == 1, f'the history was pickled {len(PICKLED)} times for {n_units} units'
    assert frame(pooled).equals(frame(serial)) and len(frame(serial)) == sum(len(i.queries) for i in insts) * 3 * 2
    assert not list((tmp_path / 'pool').glob('.run-data-*')), 'the shared data file outlived the run'


def test_a_killed_writers_run_data_is_reported_then_removed(tmp_path):
    from memlab.store import check_store
    insts = make_benchmark(2, 2, 4, seed=6)
    store = run(config('leftover'), insts, tmp_path / 'st', history=CountingHistory(), progress=False)
    left = store.root / '.run-data-0123456789abcdef.pkl'; left.write_bytes(b'x')    # as a run killed with -9 leaves it
    found = check_store(store)
    assert found['path'].tolist() == [str(left)] and 'killed writer' in found['problem'].iloc[0]
    again = tmp_path / 'again'; again.mkdir(); stale = again / left.name; stale.write_bytes(b'x')
    run(config('leftover'), insts, again, history=CountingHistory(), progress=False)   # the next run that writes removes it
    assert not stale.exists() and len(ResultsStore(again).rollouts())
