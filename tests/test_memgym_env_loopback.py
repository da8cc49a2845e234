"""MemGym II's LLM agent over the wire: the real openai and anthropic SDKs against the loopback server, whose fake model
reads only the messages it is sent. The filtered context (after compaction) must stay API-valid, the episode records
must hold the model's tool calls, and the environment's verdict must be what the model's last call earned."""
import json, re
import pytest
from loopback import LoopbackServer, Reply, _tool_results, _user_texts, _tools
from memlab.runner import run, score, load_dataset, RunConfig
from memlab.store import ResultsStore
import memlab.protocols.memgym.envs.episode  # noqa: F401
from memlab.protocols.memgym.envs.analysis import episode_frame


def toy_model(kind, req):
    "Peek until a tool result says '(last page)', then submit the number a tool result or summary it still sees states (0 if none)."
    seen = '\n'.join(_tool_results(kind, req) + _user_texts(kind, req))
    assert _tools(kind, req), 'the agent must send the environment tools'
    if '(last page)' not in seen: return Reply(tool_calls=[('peek', {})])
    m = re.search(r'number is (\d+)', seen)
    return Reply(tool_calls=[('submit', {'number': int(m.group(1)) if m else 0})])


def cfg(kind, url, memories, name='llm-toy'):
    b = {'name': kind, 'model': 'loop-model', 'base_url': url, 'timeout': 5, 'backoff': 0.01, 'cache': False}
    ds = {'kind': 'memgym-env', 'env': 'toy-counter', 'n': 4, 'seed': 0, 'step_limit': 12, 'task_args': {'pages': 6}}
    return RunConfig(name=name, section='memgym-envs', dataset=ds, policies=[{'name': 'memgym-agent', 'agent': 'llm', 'backend': b}],
                     memories=memories, conditions=[{'evidence': 'episode'}], max_steps=14, judge={'name': 'memgym-env'}), ds


MASKED = {'name': 'memgym-env', 'strategy': {'name': 'sliding-window', 'max_size': 6, 'keep_first': 1, 'max_tokens': None}, 'trigger_size': 6, 'trigger_tokens': None}
SUMM = {'name': 'memgym-env', 'strategy': {'name': 'llm-summarizing', 'max_size': 6, 'max_tokens': None}, 'trigger_size': 6, 'trigger_tokens': None}


@pytest.mark.parametrize('kind', ['openai', 'anthropic'])
def test_llm_agent_episodes_over_the_wire(tmp_path, kind):
    with LoopbackServer(kind, responder=toy_model) as srv:
        c, ds = cfg(kind, srv.url, [{'name': 'memgym-env', 'strategy': 'none'}, MASKED, SUMM])
        insts = load_dataset(ds)
        st = run(c, insts, tmp_path / 'run', progress=False, retry_errors=False)
        score(st, insts)
        n_req = srv.n_requests
    ro = st.rollouts()
    assert ro['error'].isna().all(), ro['error'].dropna().tolist()[:2]       # every request was API-valid after compaction
    ep = episode_frame(st)
    assert len(ep) == 12 and n_req == int(ep.live_calls.sum())               # one model call per live step, nothing else
    ok = ep.groupby('strategy').resolved.sum().to_dict()
    # the model sees the whole history under `none`; the window drops page 1; the offline summary keeps its sentence
    assert ok == {'none': 4, 'sliding-window': 0, 'llm-summarizing': 4}, ok
    steps = [s for s in ResultsStore(tmp_path / 'run').rollout_records()[0].trajectory.steps if s.kind == 'search']
    assert steps[1].meta['action'] == {'name': 'peek', 'arguments': {}} and steps[1].usage.input_tokens > 0


def test_estimate_prices_episodes_with_the_offline_stand_in():
    "Before the fix `estimate` searched the unit memory directly, ignoring the 'episode' setting (TypeError); now the environment's offline agent stands in."
    from memlab.runner import estimate
    c, ds = cfg('openai', 'http://127.0.0.1:9/v1', [{'name': 'memgym-env', 'strategy': 'none'}, SUMM])
    est = estimate(c, load_dataset(ds))
    assert est['rollouts'].tolist() == [4, 4]
    assert est['model_calls'].tolist() == [28, 28]          # the toy agent: 6 peeks and a submit per episode, each one call
    none, summ = est['input_tokens'].tolist()
    assert none > summ > 0                                  # the summary's shorter contexts cost fewer input tokens


def test_a_malformed_tool_call_is_the_agents_action_not_a_failed_request(tmp_path):
    "A call whose arguments are no JSON object (a tiny model's habit) was retried to failure, the rollout an error; now it is answered, once."
    first = set()
    def sloppy(kind, req):
        key = json.dumps(_user_texts(kind, req)[:1])
        if key not in first: first.add(key); return Reply(tool_calls=[('peek', 'page please')])   # arguments: a JSON string, not an object
        return toy_model(kind, req)
    with LoopbackServer('openai', responder=sloppy) as srv:
        c, ds = cfg('openai', srv.url, [{'name': 'memgym-env', 'strategy': 'none'}], name='sloppy')
        insts = load_dataset(ds)
        st = run(c, insts, tmp_path / 'run', progress=False); score(st, insts)
        n_req = srv.n_requests
    ro = st.rollouts()
    assert ro['error'].isna().all(), ro['error'].dropna().tolist()[:1]
    ep = episode_frame(st)
    assert n_req == int(ep.live_calls.sum())                         # no retries of the malformed reply
    r = ResultsStore(tmp_path / 'run').rollout_records()[0]
    s1 = [s for s in r.trajectory.steps if s.kind == 'search'][1]
    assert s1.meta['observation'].startswith('error: the call was not run: its tool arguments are a JSON str, not an object'), s1.meta['observation']
    assert ep.resolved.all()                                         # the model went on and submitted


def test_strict_callers_still_fail_a_malformed_call():
    from memlab.llm import make_backend, LLMError
    with LoopbackServer('openai', responder=lambda k, r: Reply(tool_calls=[('search_memory', 'just text')])) as srv:
        b = make_backend('openai', model='m', base_url=srv.url, timeout=5, backoff=0.01, backoff_max=0.02, cache=False, retry_budget_s=1.0)
        with pytest.raises(LLMError, match='not an object'):
            b.chat(messages=[{'role': 'user', 'content': 'q'}], tools=[{'type': 'function', 'function': {'name': 'search_memory', 'parameters': {}}}])
        r, _ = b.chat(messages=[{'role': 'user', 'content': 'q'}], tools=[{'type': 'function', 'function': {'name': 'search_memory', 'parameters': {}}}],
                      malformed_tools='keep')
        assert r.tool_calls[0].arguments == {} and 'not an object' in r.tool_calls[0].error
