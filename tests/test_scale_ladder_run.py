"""A scale-ladder run end to end: the runner with a ladder history, serial and in worker processes, and the manifest."""
import json
import pytest
from memlab.synth import make_ladder_benchmark
from memlab.protocols.scale.ladder import ladder_history
from memlab.runner import RunConfig, run, score, results_frame, ResultsStore
from memlab.cli import make_executor
from memlab.protocols.scale.protocol import with_scale, diagnostics

INSTS, POOL = make_ladder_benchmark(n_queries=8, pool_size=80, seed=1)
LADDER = (0, 20, 40)

def cfg(name='ladder'):
    return RunConfig(name=name, section='scale_ladder', dataset={'kind': 'synthetic-ladder', 'params': {'n_queries': 8, 'pool_size': 80, 'seed': 1}},
                     policies=[{'name': 'offline-reader', 'tier': 'weak'}, {'name': 'offline-reader', 'tier': 'strong'}],
                     memories=[{'name': 'bm25'}, {'name': 'entity-graph'}],
                     conditions=ladder_history(POOL, LADDER).conditions())

def table(store):
    return store.rollouts().set_index('rollout_id').sort_index()[['answer', 'n_calls', 'condition']]

def test_ladder_run_processes_match_serial_and_sizes_grow(tmp_path):
    h = ladder_history(POOL, LADDER, seed=3)
    serial = run(cfg(), INSTS, tmp_path / 's', history=h, progress=False)
    ex, close = make_executor('processes', workers=2)
    try: par = run(cfg(), INSTS, tmp_path / 'p', history=ladder_history(POOL, LADDER, seed=3), executor=ex, progress=False)
    finally: close()
    assert len(table(serial)) == 8 * 3 * 2 * 2 and table(par).equals(table(serial))
    man = serial.manifest()
    assert man['history']['ladder'] == list(LADDER) and man['history']['seed'] == 3 and man['history']['pool_size'] == 80
    # the memory really holds E(q) plus N_irr sessions: the ppr/entity graph and bm25 see a growing history
    ro = serial.rollouts()
    first = json.loads(ro['trajectory'].iloc[0])
    assert first['steps'], 'trajectories are logged'
    score(serial, INSTS)
    d = diagnostics(with_scale(results_frame(serial)), n_resamples=50)
    assert sorted(d['n_irr'].unique()) == list(LADDER)

def test_store_refuses_another_ladder(tmp_path):
    run(cfg(), INSTS, tmp_path / 's', history=ladder_history(POOL, LADDER, seed=3), progress=False)
    n = len(ResultsStore(tmp_path / 's').rollouts())
    run(cfg(), INSTS, tmp_path / 's', history=ladder_history(POOL, LADDER, seed=3), progress=False)   # same ladder: resumes
    assert len(ResultsStore(tmp_path / 's').rollouts()) == n                                     # nothing new to do
    with pytest.raises(ValueError, match='another history'):
        run(cfg(), INSTS, tmp_path / 's', history=ladder_history(POOL, LADDER, seed=4), progress=False)
    assert len(ResultsStore(tmp_path / 's').rollouts()) == n          # nothing was written

import os, subprocess, sys
from pathlib import Path
from loopback import LoopbackServer
ROOT = Path(__file__).resolve().parents[1]
NB = ROOT / 'nbs' / 'sections' / 'scale_ladder.ipynb'

def papermill(out_nb, yaml_params, env):
    return subprocess.run([sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(NB.parent), str(NB), str(out_nb),
                           '-y', yaml_params], env=env, capture_output=True, text=True, timeout=600)

def test_scale_ladder_notebook_with_openai_backend(tmp_path):
    "The same protocol with a served model (here the loopback OpenAI-compatible server): labels say so, tables are produced."
    out = tmp_path / 'out'
    env = {**os.environ, 'OPENAI_API_KEY': 'sk-memlab-test-ladder-0000', 'MEMLAB_OUT': str(out),
           'MEMLAB_CACHE': str(tmp_path / 'cache.sqlite'), 'MEMLAB_PROGRESS': '0'}
    with LoopbackServer('openai') as srv:
        p = papermill(tmp_path / 'nb.ipynb', f"""
backend: openai
models: [loop-model]
base_url: {srv.url}
n_queries: 4
pool_size: 40
ladder: [0, 10, 20]
memories: [bm25, entity-graph]
n_resamples: 50
run_name: loop""", env)
        assert p.returncode == 0, p.stderr[-3000:]
        assert srv.n_requests > 0
    t1 = (out / 'results' / 'scale_ladder' / 'table1.csv').read_text()
    assert 'llm' in t1 and 'offline' not in t1
    manifest = (out / 'results' / 'scale_ladder' / 'manifest.json').read_text()
    assert 'openai:loop-model' in manifest and 'sk-memlab-test-ladder-0000' not in manifest

def test_scale_ladder_notebook_on_longmemeval_file(tmp_path):
    "The real-data path: a LongMemEval-format file (the test fixture), its haystacks as the irrelevant pool."
    out = tmp_path / 'out'
    env = {**os.environ, 'MEMLAB_OUT': str(out), 'MEMLAB_PROGRESS': '0'}
    fx = ROOT / 'tests' / 'fixtures' / 'longmemeval_s_cleaned.json'
    p = papermill(tmp_path / 'nb.ipynb', f"""
dataset: longmemeval
data_path: {fx}
n_queries: null
ladder: [0, 2, 4]
memories: [bm25, items]
n_resamples: 50
run_name: lme""", env)
    assert p.returncode == 0, p.stderr[-3000:]
    t4 = (out / 'results' / 'scale_ladder' / 'table4.csv').read_text().splitlines()
    assert len(t4) == 1 + 3 and t4[1].split(',')[1] == '0'

@pytest.mark.parametrize('dataset', ['synthetic', 'longmemeval'])
def test_cli_resumes_a_notebook_store(tmp_path, dataset):
    "A section notebook's store is resumable from the command line: the config (and its ladder history) is in the store."
    out = tmp_path / 'out'
    env = {**os.environ, 'MEMLAB_OUT': str(out), 'MEMLAB_PROGRESS': '0'}
    fx = ROOT / 'tests' / 'fixtures' / 'longmemeval_s_cleaned.json'
    data = f'dataset: longmemeval\ndata_path: {fx}\nn_queries: 4\nladder: [0, 2, 4]' if dataset == 'longmemeval' else \
        'n_queries: 4\npool_size: 40\nladder: [0, 10, 20]'
    p = papermill(tmp_path / 'nb.ipynb', f'{data}\nmemories: [bm25, items]\nn_resamples: 20\nrun_name: nb', env)
    assert p.returncode == 0, p.stderr[-3000:]
    store = out / 'results' / 'scale_ladder' / 'runs' / 'nb'
    full = ResultsStore(store).rollouts().set_index('rollout_id').sort_index()
    shards = sorted((store / 'rollouts').glob('part-*.parquet'))
    for f in shards[len(shards) // 2:]: f.unlink()             # an interrupted run: half the shards are missing
    memlab = str(Path(sys.executable).with_name('memlab'))
    r = subprocess.run([memlab, 'resume', '--store', str(store)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    got = ResultsStore(store).rollouts().set_index('rollout_id').sort_index()
    assert list(got.index) == list(full.index)
    assert got[['answer', 'n_calls', 'error']].equals(full[['answer', 'n_calls', 'error']])

def test_notebook_retry_errors_parameter(tmp_path):
    "`retry_errors=True` re-runs, in the notebook, the rollouts that failed; the failed attempts stay as history."
    out = tmp_path / 'out'
    env = {**os.environ, 'MEMLAB_OUT': str(out), 'MEMLAB_CACHE': str(tmp_path / 'cache.sqlite'), 'MEMLAB_PROGRESS': '0'}
    params = 'backend: openai\nmodels: [loop-model]\nbase_url: {url}\nn_queries: 4\npool_size: 20\nladder: [0, 5, 10, 15, 20]\nmemories: [bm25]\n' \
             'n_resamples: 20\nrun_name: retry\nretry_errors: {retry}'
    with LoopbackServer('openai', fault_rate=0.15, faults=('401',), max_faults_per_body=10**6, seed=3) as srv:
        p = papermill(tmp_path / 'a.ipynb', params.format(url=srv.url, retry='false'), env)
        assert p.returncode == 0, p.stderr[-3000:]
        store = ResultsStore(out / 'results' / 'scale_ladder' / 'runs' / 'retry')
        n_err = int(store.rollouts()['error'].notna().sum())
        assert n_err > 0, 'no rollout failed: the test would prove nothing'
        srv.fault_rate = 0.0
        p = papermill(tmp_path / 'b.ipynb', params.format(url=srv.url, retry='true'), env)
        assert p.returncode == 0, p.stderr[-3000:]
    assert store.rollouts()['error'].isna().all() and (store.rollouts(history=True)['attempt'] == 1).sum() == n_err
