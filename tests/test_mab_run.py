"""MemoryAgentBench on the runner: checkpointed memories on resume, blind policies, and the section notebook with a
served model (loopback) and on a file in the released layout (the fixture)."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from loopback import LoopbackServer
from memlab.core import QueryView
from memlab.runner import RunConfig, run, score, results_frame, ResultsStore
from memlab.protocols.mab.agents import mab_synthetic, mab_agents, memorize_history
from memlab.protocols.mab.synth import MAB_GENERATORS

ROOT = Path(__file__).resolve().parents[1]
NB = ROOT / 'nbs' / 'sections' / 'memoryagentbench.ipynb'
DATA = dict(kind='mab-synthetic', families={'factconsolidation_sh': {}, 'ruler_qa1': {}},
            params=dict(n_contexts=1, context_tokens=3000, questions_per_context=6, seed=2), chunk_size=512)
INSTS = mab_synthetic(DATA['families'], params=DATA['params'], chunk_size=DATA['chunk_size'])

def cfg(**kw):
    return RunConfig(name='mab-test', section='memoryagentbench', dataset=DATA,
                     policies=[{'name': 'mab-reader', 'tier': 'strong'}], memories=mab_agents(names=('long-context', 'bm25', 'items')),
                     judge={'name': 'mab-metric', 'catalogue': 'synthetic'}, **kw)

def test_resume_loads_checkpointed_memories_and_scores_identically(tmp_path):
    full = run(cfg(checkpoint_memories=True), INSTS, tmp_path / 'a', history=memorize_history, progress=False); score(full, INSTS)
    ro = full.rollouts()
    assert len(ro) == 3 * 12 and not ro['timings'].map(lambda t: json.loads(t)['ingest_loaded']).any()
    ckpts = sorted((tmp_path / 'a' / 'memories').glob('*.pkl'))
    assert len(ckpts) == 2 * 3                                   # one per (context, memory)
    # a crash after some units: keep the first shard's rollouts only, then resume
    shards = sorted((tmp_path / 'a').rglob('rollouts/*.parquet'))
    assert len(shards) >= 1
    keep = ro.iloc[:10]
    for s in shards: s.unlink()
    ResultsStore(tmp_path / 'a').write_rollouts([__import__('memlab.core', fromlist=['Rollout']).Rollout.from_row(r) for r in keep.to_dict('records')])
    for s in (tmp_path / 'a').rglob('scores/*.parquet'): s.unlink()
    st = run(cfg(checkpoint_memories=True), INSTS, tmp_path / 'a', history=memorize_history, progress=False); score(st, INSTS)
    ro2 = st.rollouts()
    assert len(ro2) == len(ro) and ro2['rollout_id'].is_unique
    new = ro2[~ro2['rollout_id'].isin(keep['rollout_id'])]
    assert new['timings'].map(lambda t: json.loads(t)['ingest_loaded']).all()   # loaded, not memorized again
    a = results_frame(full).set_index('rollout_id').sort_index()
    b = results_frame(st).set_index('rollout_id').sort_index()
    assert a['answer'].tolist() == b['answer'].tolist() and a['score'].tolist() == b['score'].tolist()

def test_checkpoint_flag_is_not_part_of_the_config_hash():
    assert cfg().config_hash == cfg(checkpoint_memories=True).config_hash

@pytest.mark.parametrize('family', list(MAB_GENERATORS))
def test_views_carry_no_gold_and_no_keypoints(family):
    insts = mab_synthetic({family: {'questions_per_context': 1} if family == 'infbench_sum' else {}},
                          params=dict(n_contexts=1, context_tokens=3000, questions_per_context=4, seed=5))
    for inst in insts:
        for q in inst.queries:
            v = q.view()
            assert isinstance(v, QueryView) and set(v.model_dump()) == {'question', 'date', 'task', 'inputs'}
            assert set(v.inputs) <= {'previous_events', 'demo'}
            text = v.to_json()
            for kp in q.meta.get('keypoints', []): assert kp not in text
            assert q.id not in text
            # the gold is never in the view, except where the task shows it among the options (EventQA, by design)
            if not family.startswith('eventqa'):
                assert not any(len(g) > 3 and g in text for g in q.answers), (family, q.answers)

def papermill(out_nb, yaml_params, env):
    return subprocess.run([sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(NB.parent), str(NB), str(out_nb),
                           '-y', yaml_params], env=env, capture_output=True, text=True, timeout=900)

SMALL = """
families: [factconsolidation_sh, icl_banking77]
context_tokens: 2500
questions_per_context: 4
agents: [long-context, bm25, items]
topk_ablation: [2, 10]
chunk_sizes: [512]
context_lengths: [2500]
ablation_families: [factconsolidation_sh]
n_resamples: 50
"""

def test_mab_notebook_with_openai_backend(tmp_path):
    "The same protocol with a served model: the paper's prompts reach the server, labels say which model answered."
    out = tmp_path / 'out'
    env = {**os.environ, 'OPENAI_API_KEY': 'sk-memlab-test-mab-0000', 'MEMLAB_OUT': str(out),
           'MEMLAB_CACHE': str(tmp_path / 'cache.sqlite'), 'MEMLAB_PROGRESS': '0'}
    with LoopbackServer('openai') as srv:
        p = papermill(tmp_path / 'nb.ipynb', SMALL + f"""
backend: openai
models: [loop-model]
base_url: {srv.url}
run_name: loop""", env)
        assert p.returncode == 0, p.stderr[-3000:]
        prompts = [r['messages'][-1]['content'] for r in srv.requests if r and r.get('messages')]
        assert any(x.startswith('Here is a list of knowledge retrieved from memory: ') for x in prompts)   # Figure 6
        assert any(x.startswith('Here is a knowledge pool with lots of new facts: ') for x in prompts)     # Figure 5
        assert {r.get('max_tokens') for r in srv.requests if r} <= {10, 20}                               # Table 14
    t2 = (out / 'results' / 'memoryagentbench' / 'table2.csv').read_text()
    assert 'openai:loop-model' in t2 and 'offline' not in t2
    manifest = (out / 'results' / 'memoryagentbench' / 'manifest.json').read_text()
    assert 'sk-memlab-test-mab-0000' not in manifest and 'chunk_tokenizer' in manifest

def test_mab_notebook_on_released_layout_file(tmp_path):
    "The real-data path: the fixture in the released row layout, Conflict Resolution rows."
    out = tmp_path / 'out'
    env = {**os.environ, 'MEMLAB_OUT': str(out), 'MEMLAB_PROGRESS': '0'}
    p = papermill(tmp_path / 'nb.ipynb', SMALL + f"""
dataset: memoryagentbench
data_path: {ROOT / 'tests' / 'fixtures' / 'memoryagentbench.json'}
sources: CR
run_name: fixture""", env)
    assert p.returncode == 0, p.stderr[-3000:]
    t2 = (out / 'results' / 'memoryagentbench' / 'table2.csv').read_text()
    assert 'FactCon-SH' in t2 and 'MCC' not in t2

@pytest.mark.parametrize('spec', mab_agents(names=('long-context', 'bm25', 'dense', 'ppr-graph', 'items')), ids=lambda s: s['name'])
def test_prepared_memories_checkpoint_and_search_identically(spec, tmp_path):
    "prepare() builds the lazy indexes inside construction; the prepared memory survives a checkpoint round trip."
    from memlab.checkpoint import MemoryCheckpoint
    spec = dict(spec, embedder='hash-embed') if spec['name'] == 'dense' else spec
    sessions = memorize_history(INSTS[0], {})
    ck = MemoryCheckpoint(tmp_path); built, status = ck.get_or_build(spec, sessions)
    assert status == 'built' and ck.build_s > 0
    loaded, status2 = MemoryCheckpoint(tmp_path).get_or_build(spec, sessions)
    assert status2 == 'loaded'
    for q in INSTS[0].queries:
        a, b = built.search(q.question), loaded.search(q.question)
        assert [(e.session_id, e.text, round(e.score, 9)) for e in a] == [(e.session_id, e.text, round(e.score, 9)) for e in b]

def test_cli_resumes_a_memorize_store(tmp_path):
    "A MemoryAgentBench store (memorize-message history, checkpoints) resumes from the command line with the config it records."
    st = run(cfg(checkpoint_memories=True, history={'name': 'memorize'}), INSTS, tmp_path / 'a', history=memorize_history, progress=False)
    full = st.rollouts().set_index('rollout_id').sort_index()
    keep = ResultsStore(tmp_path / 'a').rollout_records()[:10]   # an interrupted run: 10 of 36 rollouts stored
    for s in (tmp_path / 'a' / 'rollouts').glob('*.parquet'): s.unlink()
    ResultsStore(tmp_path / 'a').write_rollouts(keep)
    memlab = str(Path(sys.executable).with_name('memlab'))
    r = subprocess.run([memlab, 'resume', '--store', str(tmp_path / 'a')], capture_output=True, text=True, timeout=600,
                       env={**os.environ, 'MEMLAB_PROGRESS': '0'})
    assert r.returncode == 0, r.stderr
    got = ResultsStore(tmp_path / 'a').rollouts().set_index('rollout_id').sort_index()
    assert list(got.index) == list(full.index) and got['answer'].equals(full['answer'])
