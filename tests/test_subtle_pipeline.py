"""SubtleMemory through the harness (issue 14, items 2, 3 and 5): the three settings run as evidence settings of one answer
step; each memory ingests a persona once for both memory settings; perfect retrieval reads back only what a memory stored
from the target sessions, at any ingestion granularity; a memory without provenance is refused before any work; the
released excerpt and memlab's fixtures go through the whole pipeline.
"""
from pathlib import Path
import pandas as pd
import pytest
from memlab.core import RecordError
from memlab.memory import MEMORIES, Memory
from memlab.flat import BM25Memory
from memlab.runner import RunConfig, run, score, build_judge, ResultsStore
from memlab.protocols.subtle.protocol import subtlememory_dataset, run_configs, query_frame, check_params, SUBTLE_PARAMS
from memlab.protocols.subtle.waterfall import waterfall

ROOT = Path(__file__).resolve().parents[1]
EXCERPT = ROOT.parent / 'shared' / 'fixtures' / 'subtlememory'
FX = ROOT / 'tests' / 'fixtures' / 'subtlememory'
READER = [{'name': 'subtlememory-reader', 'tier': 'strong'}]
JUDGE = {'name': 'subtlememory-offline'}

INGESTED = []

class CountingBM25(BM25Memory):
    "BM25 that records every session it ingests (a test memory)."
    def add_all(self, sessions):
        sessions = list(sessions); INGESTED.extend(s.id for s in sessions); super().add_all(sessions)

class NoProvenance(Memory):
    "A memory that keeps no provenance (no readback)."
    family = 'none'
    def add(self, session): pass
    def search(self, query, k=None): return []
    def reset(self): pass


@pytest.fixture(autouse=True, scope='module')
def test_memories():
    "Register the test memories for this module only: other modules iterate the registry."
    for name, cls in (('counting-bm25', CountingBM25), ('no-provenance', NoProvenance)): MEMORIES.register(name)(cls)
    yield
    for name in ('counting-bm25', 'no-provenance'): MEMORIES.pop(name, None)


def _run(cfgs, insts, tmp):
    j, frames, stores = build_judge(JUDGE), [], {}
    for key, c in cfgs.items():
        stores[key] = st = run(c, insts, tmp / key, progress=False)
        score(st, insts, judge_obj=j); frames.append(query_frame(st, j, insts))
    return pd.concat(frames, ignore_index=True), stores


def test_each_memory_ingests_a_persona_once_for_both_memory_settings(tmp_path):
    INGESTED.clear()
    insts = subtlememory_dataset(n_personas=2, n_unrelated=6)
    cfgs = run_configs({'kind': 'subtlememory', 'n_personas': 2, 'n_unrelated': 6}, READER, [{'name': 'counting-bm25', 'k': 20}],
                       ['perfect', 'default'], JUDGE)
    fr, _ = _run(cfgs, insts, tmp_path)
    assert sorted(INGESTED) == sorted(s.id for i in insts for s in i.sessions)     # every session once, not once per setting
    assert set(fr['setting']) == {'perfect', 'default'} and len(fr) == 2 * sum(len(i.queries) for i in insts)


@pytest.mark.parametrize('granularity', ['session', 'message', 'batch'])
def test_perfect_retrieval_reads_back_only_the_target_sessions(tmp_path, granularity):
    insts = subtlememory_dataset(n_personas=1, n_unrelated=6)
    targets = {q.id: set(q.evidence) for q in insts[0].queries}
    mems = [{'name': 'bm25', 'k': 20}, {'name': 'items', 'k': 20}, {'name': 'ppr-graph', 'k': 20}, {'name': 'long-context', 'window_tokens': 100_000}]
    cfgs = run_configs({'kind': 'subtlememory', 'n_personas': 1, 'n_unrelated': 6}, READER, mems, ['perfect', 'default'], JUDGE,
                       granularity=granularity, batch=2)
    _, stores = _run(cfgs, insts, tmp_path)
    ro = stores['memory'].rollout_records()
    rb = [r for r in ro if r.condition == {'evidence': 'readback'}]
    assert len(rb) == len(mems) * len(insts[0].queries)
    for r in rb:
        units = r.trajectory.steps[0].observation
        src = {u.session_id.split('#')[0] for u in units}
        assert units and src <= targets[r.query_id], (r.memory, src)
        if r.memory.startswith('long-context'): continue       # one window unit
        assert {u.score for u in units} == {1.0}
        if r.memory.startswith('bm25'): assert src == targets[r.query_id]   # every target session's chunks
        if granularity == 'message': assert all('#' in u.session_id for u in units)
    dflt = [r for r in ro if r.condition == {'evidence': 'search'} and r.memory.startswith('bm25')]
    assert all(len(r.trajectory.steps[0].observation) <= 20 for r in dflt)          # top-k 20
    assert any({u.session_id.split('#')[0] for u in r.trajectory.steps[0].observation} - targets[r.query_id] for r in dflt)


def test_a_memory_without_provenance_is_refused_before_any_work(tmp_path):
    cfg = dict(name='t', policies=READER, memories=[{'name': 'bm25'}, {'name': 'no-provenance'}], conditions=[{'evidence': 'readback'}])
    with pytest.raises(RecordError, match="field 'conditions.0.evidence': 'readback' reads stored units back by session, and memory 'no-provenance' keeps no provenance"):
        RunConfig.load(cfg)
    with pytest.raises(ValueError, match="memories: 'no-provenance' keeps no provenance"):
        check_params(memories=['no-provenance'])
    RunConfig.load({**cfg, 'conditions': [{'evidence': 'search'}]})                 # its own search is fine
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize('where', ['excerpt', 'fixtures'])
def test_released_layouts_go_through_the_whole_pipeline(tmp_path, where):
    path = EXCERPT if where == 'excerpt' else FX
    if not path.exists(): pytest.skip(f'{path} is absent (../shared is not checked out)')
    spec = {'kind': 'subtlememory', 'source': 'released', 'path': str(path)}
    insts = subtlememory_dataset('released', str(path))
    mems = check_params(**{**SUBTLE_PARAMS, 'k': 5, 'window_tokens': 300}).memory_specs()
    pols = [{'name': 'subtlememory-reader', 'tier': t} for t in ('strong', 'weak')]
    fr, _ = _run(run_configs(spec, pols, mems, ['oracle', 'perfect', 'default'], JUDGE), insts, tmp_path)
    n_q = sum(len(i.queries) for i in insts)
    assert len(fr) == 2 * n_q * (1 + 2 * len(mems)) and fr.attrs['n_error'] == 0
    wf = waterfall(fr, n_resamples=100, seed=0)
    assert set(wf['memory']) == {spec_m for spec_m in fr['memory'] if spec_m != 'oracle'}
    assert (wf['n'] > 0).all()

