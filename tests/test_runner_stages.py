"""Runner stages: Dask execution on a LocalCluster, and scoring separate from generation."""
import os
import pytest
from memlab.runner import RunConfig, run, score, results_frame, ResultsStore
from memlab.cli import make_executor
from memlab.synth import make_benchmark
from memlab.judge import Judge, register_judge

BENCH = make_benchmark(4, 5, 10, seed=5)
CFG = RunConfig(name='stages', policies=[{'name': 'offline-reader', 'tier': 'weak'}, {'name': 'offline-reader', 'tier': 'strong'}],
                memories=[{'name': 'bm25', 'k': 12}, {'name': 'long-context', 'window_tokens': 1500}])

def table(store):
    return store.rollouts().set_index('rollout_id').sort_index()[['answer', 'n_calls', 'policy', 'memory']]

def test_dask_localcluster_matches_serial(tmp_path):
    serial = run(CFG, BENCH, tmp_path / 'serial', progress=False)
    ex, close = make_executor('dask', workers=2, threads=2)      # 2 processes x 2 threads, as for API-bound runs
    try: dask = run(CFG, BENCH, tmp_path / 'dask', executor=ex, progress=False)
    finally: close()
    assert len(table(dask)) == 4 * 5 * 2 * 2
    assert table(dask).equals(table(serial))

class AlwaysWrong(Judge):
    "A second judge for the test: every answer is WRONG."
    model = 'test'
    def prompt_texts(self): return 'always wrong'
    def _verdict(self, query, answer): return 'WRONG', None, 'test'

@pytest.fixture
def always_wrong():
    from memlab.judge import JUDGES
    register_judge('always-wrong-test')(AlwaysWrong)
    yield
    JUDGES.pop('always-wrong-test')          # keep the global registry as the library defines it

def test_rejudging_never_regenerates(tmp_path, always_wrong):
    st = run(CFG, BENCH, tmp_path / 'run', progress=False)
    shards = {p: p.stat().st_mtime_ns for p in (tmp_path / 'run' / 'rollouts').glob('*.parquet')}
    score(st, BENCH)
    score(st, BENCH, judge={'name': 'always-wrong-test'})
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / 'run' / 'rollouts').glob('*.parquet')} == shards
    a, b = results_frame(st, judge='offline-match'), results_frame(st, judge='always-wrong-test')
    assert a['correct'].mean() > 0 and b['correct'].eq(0).all()
    assert {j['judge'] for j in st.manifest()['judges']} == {'offline-match', 'always-wrong-test'}
    with pytest.raises(ValueError, match='several judges'): results_frame(st)

def test_manifest_records_data_file_hash(tmp_path):
    import hashlib, json
    from memlab.runner import load_dataset
    f = tmp_path / 'instances.json'
    f.write_text(json.dumps([i.model_dump(mode='json') for i in BENCH[:2]]))
    spec = {'kind': 'instances', 'path': str(f)}
    cfg = RunConfig.load(CFG.model_dump() | {'dataset': spec})
    st = run(cfg, load_dataset(spec), tmp_path / 'run', progress=False)
    assert st.manifest()['dataset']['file_sha256'] == hashlib.sha256(f.read_bytes()).hexdigest()


def test_scoring_reads_no_trajectory(tmp_path, monkeypatch):
    "A judge needs ids, the answer and the error: score() reads those columns, not every trajectory (600 MB per 6,000 MemTrace rollouts)."
    bench = make_benchmark(n_instances=2, queries_per_instance=3, n_filler=2, seed=0)
    cfg = RunConfig(name='s', policies=[{'name': 'offline-reader', 'tier': 'strong'}], memories=[{'name': 'bm25', 'k': 5}])
    st = run(cfg, bench, tmp_path / 's', progress=False)
    read = []
    real = ResultsStore.rollouts
    def spy(self, *a, **kw):
        read.append(kw.get('columns')); return real(self, *a, **kw)
    monkeypatch.setattr(ResultsStore, 'rollouts', spy)
    out = score(st, bench)
    assert len(out) == 6 and out['correct'].notna().all()
    assert read and all(c is not None and 'trajectory' not in c for c in read), read
