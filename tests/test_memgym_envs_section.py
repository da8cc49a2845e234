"""The MemGym II section (issue 26): with backend=openai against the loopback server the notebook runs unchanged, the
agent's requests carry the environment's tools and API-valid histories after compaction, the summarizer is the named
model, and the key appears nowhere; a bad parameter is one line naming it, before any work."""
import json, os
from pathlib import Path
import pandas as pd
from loopback import LoopbackServer, default_responder
from section_runner import papermill_section

FAKE_KEY = 'sk-memlab-envs-DO-NOT-LEAK-51c7'


def test_envs_section_with_openai_backend_and_no_key_leak(tmp_path):
    out = tmp_path / 'out'
    env = {**os.environ, 'OPENAI_API_KEY': FAKE_KEY, 'MEMLAB_OUT': str(out), 'MEMLAB_CACHE': str(tmp_path / 'c.sqlite'), 'MEMLAB_PROGRESS': '0'}
    with LoopbackServer('openai', responder=default_responder) as srv:
        nb = tmp_path / 'envs-openai.ipynb'
        p = papermill_section('memgym_envs', nb, env, ('backend', 'openai'), ('models', ['loop-model']), ('base_url', srv.url),
                              ('summarizer_model', 'loop-sum'), ('strategies', ['none', 'llm-summarizing']), ('envs', ['dialogue', 'web']),
                              ('n_tasks', 2), ('env_settings', {'dialogue': {'step_limit': 8, 'max_size': 6}, 'web': {'step_limit': 8, 'max_size': 6}}), ('ablation_envs', ['dialogue']), ('replay_envs', ['web']),
                              ('n_resamples', 100), ('run_name', 'loop'))
        assert p.returncode == 0, p.stderr[-3000:]
        reqs = [r for r in srv.requests if r and r.get('messages')]
        errors = srv.n_errors if hasattr(srv, 'n_errors') else None
    agent = [r for r in reqs if r['model'] == 'loop-model']
    assert agent and all(r.get('tools') for r in agent)                                  # the environment's tools on every call
    assert all(r['messages'][0]['role'] == 'system' for r in agent)
    assert any(r['model'] == 'loop-sum' for r in reqs), 'the summarizer was never called'
    res = out / 'results' / 'memgym_envs'
    t2 = pd.read_csv(res / 'table2_gyms.csv')
    assert set(t2['track']) == {'dialogue', 'web'} and set(t2['label']) == {'openai:loop-model'}
    assert (res / 'table7_web.csv').exists() and (res / 'ablation_dialogue.csv').exists() and not (res / 'agent_ceiling.csv').exists()
    from memlab.store import ResultsStore
    for s in (out / 'results' / 'memgym_envs' / 'runs').iterdir():
        ro = ResultsStore(s).rollouts()
        assert ro['error'].isna().all(), (s.name, ro['error'].dropna().tolist()[:2])     # the loopback refuses API-invalid histories
    outputs = json.dumps([c.get('outputs', []) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code'])
    assert 'no LLM' not in outputs
    leaks = [str(f) for d in (out, tmp_path) for f in d.rglob('*') if f.is_file() and FAKE_KEY.encode() in f.read_bytes()]
    assert not leaks and FAKE_KEY not in p.stdout + p.stderr, leaks


def test_a_bad_parameter_is_one_line_before_any_work(tmp_path):
    env = {**os.environ, 'MEMLAB_OUT': str(tmp_path / 'out'), 'MEMLAB_PROGRESS': '0'}
    p = papermill_section('memgym_envs', tmp_path / 'bad.ipynb', env, ('envs', ['dialogue', 'nowhere']))
    assert p.returncode != 0 and "memgym_envs parameter envs: unknown environment 'nowhere'" in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / 'out' / 'results' / 'memgym_envs' / 'runs').exists()
