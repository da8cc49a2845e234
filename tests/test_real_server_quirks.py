"""What broke against a real OpenAI-compatible server (llama-cpp-python serving a real model), reproduced with the
loopback server made as strict as that server (127.0.0.1 only): each test failed on the code before its fix."""
import json

from loopback import LoopbackServer
from memlab.runner import RunConfig, run, load_dataset


def test_multi_step_tool_calls_pass_a_strict_server(tmp_path, monkeypatch):
    "After a search_memory call memlab sent the assistant turn with content null; llama-cpp-python answers HTTP 500."
    monkeypatch.setenv('OPENAI_API_KEY', 'sk-test'); monkeypatch.setenv('MEMLAB_CACHE', str(tmp_path / 'c.sqlite'))
    data = {'kind': 'synthetic', 'params': {'n_instances': 1, 'queries_per_instance': 4, 'n_filler': 6, 'seed': 1}}
    with LoopbackServer('openai') as srv:
        cfg = RunConfig(name='strict', dataset=data, memories=[{'name': 'items', 'k': 12}],   # an iterative memory: several model calls
                        policies=[{'name': 'llm', 'backend': {'name': 'openai', 'model': 'm', 'base_url': srv.url, 'cache': False,
                                                               'max_attempts': 1}}])
        st = run(cfg, load_dataset(data), tmp_path / 'store', progress=False)
        tool_turns = [m for r in srv.requests for m in r['messages'] if m['role'] == 'tool']
    ro = st.rollouts()
    assert ro['error'].isna().all(), ro['error'].dropna().iloc[0]
    assert tool_turns, 'no request carried a tool result: the case tested nothing'
    assert all(m['content'] is not None for r in srv.requests for m in r['messages'])


def test_an_errored_rollout_keeps_what_finished_before_the_error(tmp_path, monkeypatch):
    "A server that fails the second call of an agent loop: the rollout is an error, and keeps the first call's search and usage."
    from loopback import default_responder
    monkeypatch.setenv('OPENAI_API_KEY', 'sk-test'); monkeypatch.setenv('MEMLAB_CACHE', str(tmp_path / 'c.sqlite'))
    def responder(kind, req):
        if any(m['role'] == 'tool' for m in req['messages']): raise RuntimeError('the server gave up')   # -> HTTP 400
        return default_responder(kind, req)
    data = {'kind': 'synthetic', 'params': {'n_instances': 1, 'queries_per_instance': 2, 'n_filler': 6, 'seed': 1}}
    with LoopbackServer('openai', responder=responder) as srv:
        cfg = RunConfig(name='partial', dataset=data, memories=[{'name': 'items', 'k': 12}],
                        policies=[{'name': 'llm', 'backend': {'name': 'openai', 'model': 'm', 'base_url': srv.url, 'cache': False,
                                                               'max_attempts': 1}}])
        st = run(cfg, load_dataset(data), tmp_path / 'store', progress=False)
    ro = st.rollout_records()
    assert ro and all(r.error for r in ro)
    for r in ro:
        assert [s.kind for s in r.trajectory.steps] == ['search'] and r.n_calls == 1    # the first model call's search
        assert r.usage.input_tokens > 0                                                # and what it cost


def test_a_server_that_ignores_tools_is_reported(tmp_path, monkeypatch):
    "A model whose chat template drops `tools` never calls search_memory: the run says so instead of scoring it silently."
    import pytest
    from loopback import Reply
    from memlab.runner import RunWarning
    monkeypatch.setenv('OPENAI_API_KEY', 'sk-test'); monkeypatch.setenv('MEMLAB_CACHE', str(tmp_path / 'c.sqlite'))
    data = {'kind': 'synthetic', 'params': {'n_instances': 1, 'queries_per_instance': 2, 'n_filler': 6, 'seed': 1}}
    with LoopbackServer('openai', responder=lambda kind, req: Reply(content='Answer: no idea')) as srv:
        cfg = RunConfig(name='notools', dataset=data, memories=[{'name': 'items', 'k': 12}, {'name': 'bm25', 'k': 12}],
                        policies=[{'name': 'llm', 'backend': {'name': 'openai', 'model': 'm', 'base_url': srv.url, 'cache': False}}])
        with pytest.warns(RunWarning, match=r'made no search_memory call in 2 answered rollouts on the iterative memory items\[k=12\]'):
            run(cfg, load_dataset(data), tmp_path / 'store', progress=False)


def test_section_notebook_passes_timeout_and_max_tokens(tmp_path):
    "A CPU server needs a longer timeout and a smaller max_tokens: both are section parameters and reach the requests."
    import os, subprocess, sys
    from pathlib import Path
    nb = Path(__file__).resolve().parents[1] / 'nbs' / 'sections' / 'walkthrough.ipynb'
    env = {**os.environ, 'OPENAI_API_KEY': 'sk-test', 'MEMLAB_OUT': str(tmp_path / 'out'), 'MEMLAB_PROGRESS': '0',
           'MEMLAB_CACHE': str(tmp_path / 'c.sqlite')}
    with LoopbackServer('openai') as srv:
        r = subprocess.run([sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(nb.parent), str(nb), str(tmp_path / 'o.ipynb'),
                            '-p', 'backend', 'openai', '-p', 'model', 'loop', '-p', 'base_url', srv.url, '-p', 'max_tokens', '77',
                            '-p', 'timeout', '5', '-p', 'n_instances', '1', '-p', 'queries_per_instance', '3', '-p', 'n_filler', '4',
                            '-p', 'n_resamples', '20'], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        answers = [q for q in srv.requests if q.get('tools') or 'Retrieved memories' in json.dumps(q)]
    assert answers and all(q['max_tokens'] == 77 for q in answers)
    from memlab.runner import ResultsStore
    (store,) = (tmp_path / 'out' / 'results' / 'walkthrough' / 'runs').iterdir()
    names = set(ResultsStore(store).rollouts()['policy'])                # short model labels, not the whole backend dict
    assert names == {f"llm[model=loop@{srv.url.split('//')[1].split('/')[0]},max_tokens=77]"}, names
