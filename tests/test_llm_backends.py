"""memlab's own backends (not just the SDKs) against loopback servers with injected faults.

- a grid of LLM-policy rollouts completes, over both SDKs and each of their transports (openai: direct, aiohttp, httpx; anthropic:
  aiohttp, httpx), with 20% of calls failing (429 + Retry-After, 500, timeouts,
  truncated JSON): every rollout is either answered and scored, or carries an error with its cause;
  retries are bounded;
- when a call cannot succeed, the rollout is stored with the error and is never scored as wrong;
- a second identical run is served from the response cache: zero HTTP requests at the server;
- the walkthrough notebook runs unchanged with backend=openai against the loopback server, and a fake API key
  in the environment appears nowhere under results/, in the cache, in logs or in the notebook outputs.
"""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from loopback import LoopbackServer
from memlab.runner import RunConfig, run, score, results_frame, ResultsStore
from memlab.synth import make_benchmark
from memlab.llm import OpenAIBackend, AnthropicBackend

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures('iterative_bm25')   # 'bm25-iterative-test' (conftest)

def grid(kind, url, tmp, name, fault_cache=None, **backend):
    spec = {'name': kind, 'model': 'loop-model', 'base_url': url, 'timeout': 0.5, 'backoff': 0.01, 'backoff_max': 0.2,
            'cache': str(fault_cache) if fault_cache else False, **backend}
    return RunConfig(name=name, policies=[{'name': 'llm', 'backend': spec}],
                     memories=[{'name': 'bm25-iterative-test', 'k': 5}, {'name': 'bm25', 'k': 5}],
                     judge={'name': 'offline-match'})

BENCH = make_benchmark(2, 6, 10, seed=3)

@pytest.mark.parametrize('kind,transport', [(k, t) for k, c in (('openai', OpenAIBackend), ('anthropic', AnthropicBackend)) for t in c.TRANSPORTS])
def test_grid_completes_under_faults(kind, transport, tmp_path):
    with LoopbackServer(kind, fault_rate=0.2, retry_after=0.02, hang=1.5, seed=1) as srv:
        url = srv.url if kind == 'openai' else srv.root
        st = run(grid(kind, url, tmp_path, 'faulty', max_attempts=6, transport=transport), BENCH, tmp_path / 'run', progress=False)
        score(st, BENCH)
        df = results_frame(st)
        n_calls_model = sum(json.loads(t)['steps'].__len__() for t in st.rollouts()['trajectory'])
        assert len(df) == 2 * 6 * 2 and df['rollout_id'].is_unique
        assert sum(srv.n_faults.values()) > 0, 'no fault was injected: the test would prove nothing'
        assert set(srv.n_faults) >= {'429', '500', 'timeout', 'truncated'} or sum(srv.n_faults.values()) >= 4
        ok = df['error'].isna()
        assert ok.all(), df.loc[~ok, 'error'].tolist()          # 6 attempts absorb 20% faults (at most 3 per body)
        assert df['correct'].notna().all()
        assert srv.n_requests <= 6 * n_calls_model               # bounded retries
        assert (df['n_calls'] >= 1).all()
        assert df['policy_label'].eq(f'{kind}:loop-model').all()

@pytest.mark.parametrize('transport', list(OpenAIBackend.TRANSPORTS))
def test_unrecoverable_calls_become_errors_not_wrong_answers(transport, tmp_path):
    with LoopbackServer('openai', fault_rate=1.0, faults=('500',), max_faults_per_body=10**6) as srv:
        st = run(grid('openai', srv.url, tmp_path, 'down', max_attempts=2, max_consecutive_failures=5, transport=transport, concurrency=2),
                 BENCH, tmp_path / 'run', progress=False)
        score(st, BENCH)
        df = results_frame(st)
        assert len(df) == 24 and df['error'].notna().all() and df['correct'].isna().all()
        assert df['error'].str.contains('InternalServerError|consecutive calls failed').all()
        # the failure cap stops further calls: at most (cap - 1 + calls in flight) calls of 2 attempts reach the server, not 24 x 2
        assert srv.n_requests <= (5 - 1 + 2) * 2
        assert (df['n_error'] >= 1).all()                        # counted as errors by the scorer, never as WRONG

def test_second_identical_run_is_served_from_cache(tmp_path):
    with LoopbackServer('openai') as srv:
        cfg = grid('openai', srv.url, tmp_path, 'cached', fault_cache=tmp_path / 'cache.sqlite')
        run(cfg, BENCH, tmp_path / 'a', progress=False)
        first = srv.n_requests
        run(cfg, BENCH, tmp_path / 'b', progress=False)          # a fresh store: every rollout is generated again
        assert first > 0 and srv.n_requests == first
        a, b = (ResultsStore(tmp_path / x).rollouts().set_index('rollout_id').sort_index() for x in 'ab')
        assert a['answer'].tolist() == b['answer'].tolist()
        usage = [json.loads(u) for u in b['usage']]
        assert all(u['cached'] == u['calls'] and u['cost_usd'] == 0 for u in usage)

FAKE_KEY = 'sk-memlab-test-DO-NOT-LEAK-7f3a9c'

def test_walkthrough_with_openai_backend_and_no_key_leak(tmp_path):
    out, cache = tmp_path / 'out', tmp_path / 'cache.sqlite'
    env = {**os.environ, 'OPENAI_API_KEY': FAKE_KEY, 'MEMLAB_OUT': str(out), 'MEMLAB_CACHE': str(cache), 'MEMLAB_PROGRESS': '0'}
    with LoopbackServer('openai') as srv:
        nb = tmp_path / 'walkthrough-openai.ipynb'
        p = subprocess.run([sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(ROOT / 'nbs' / 'sections'),
                            str(ROOT / 'nbs' / 'sections' / 'walkthrough.ipynb'), str(nb),
                            '-p', 'backend', 'openai', '-p', 'model', 'loop-model', '-p', 'base_url', srv.url,
                            '-p', 'judge_model', 'loop-judge', '-p', 'n_instances', '2', '-p', 'run_name', 'loop'],
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        auth = [h.get('authorization', '') for h in srv.headers]
        assert auth and all(FAKE_KEY in a for a in auth), 'the key was not used: the leak check would prove nothing'
    cells = json.loads(nb.read_text())['cells']
    outputs = json.dumps([c.get('outputs', []) for c in cells if c['cell_type'] == 'code'])
    assert 'openai:loop-model' in outputs and 'offline reader (no LLM)' not in outputs
    manifest = json.loads((out / 'results' / 'walkthrough' / 'manifest.json').read_text())
    assert manifest['labels'] == ['openai:loop-model'] and [j['model'] for j in manifest['judges'] if j['judge'] == 'llm-a3'] == ['loop-judge']
    leaks = [str(f) for d in (out, tmp_path) for f in d.rglob('*') if f.is_file() and FAKE_KEY.encode() in f.read_bytes()]
    leaks += ['stdout'] * (FAKE_KEY in p.stdout) + ['stderr'] * (FAKE_KEY in p.stderr)
    assert not leaks, f'the API key leaked into {leaks}'
    assert list(out.rglob('rollouts/*.parquet')) and cache.exists()   # there was something to search

@pytest.mark.parametrize('transport', ['direct', 'aiohttp'])
def test_async_client_is_closed_when_backend_is_dropped(transport, caplog):
    "The aiohttp session of a dropped backend is closed on the loop, never reported as unclosed."
    import gc, logging
    with LoopbackServer('openai') as srv, caplog.at_level(logging.ERROR, logger='asyncio'):
        b = OpenAIBackend('loop-model', base_url=srv.url, cache=False, timeout=5, transport=transport)
        r, _ = b.chat([{'role': 'user', 'content': 'Question: what is my dog called?'}])
        session = b._client._shared['session'] if transport == 'direct' else b._client._client._transport.client   # the aiohttp.ClientSession
        assert r.content is not None and not session.closed
        del b; gc.collect()
        assert session.closed and 'Unclosed' not in caplog.text

def test_direct_transport_sends_what_the_sdk_sends(monkeypatch):
    "transport='direct' (the default): the same URL, body and headers as the SDK's own request, the key from the environment."
    monkeypatch.setenv('MEMLAB_TEST_DIRECT_KEY', 'sk-direct-0123456789')
    monkeypatch.setenv('OPENAI_ORG_ID', 'org-memlab-test')           # read by the SDK: its header must be sent too
    msgs = [{'role': 'user', 'content': 'Question: what is my dog called? \u00e9t\u00e9'}]
    sent = {}
    with LoopbackServer('openai') as srv:
        for transport in ('direct', 'aiohttp'):
            b = OpenAIBackend('loop-model', base_url=srv.url, cache=False, api_key_env='MEMLAB_TEST_DIRECT_KEY', transport=transport,
                              params={'temperature': 0.0, 'max_tokens': 7})
            b.chat(msgs, tools=[], sample=0)
            sent[transport] = (srv.bodies[-1], srv.headers[-1], srv.log[-1])
    assert OpenAIBackend('m', base_url='http://x/v1').transport == 'direct'
    (body_d, head_d, path_d), (body_s, head_s, path_s) = sent['direct'], sent['aiohttp']
    assert body_d == body_s and path_d == path_s            # byte for byte: the same JSON serialization
    per_request = {'x-stainless-retry-count', 'x-stainless-read-timeout', 'content-length', 'accept-encoding', 'connection', 'host'}
    same = lambda h: {k: v for k, v in h.items() if k not in per_request}
    assert same(head_d) == same(head_s), (same(head_d), same(head_s))
    assert head_d['authorization'] == 'Bearer sk-direct-0123456789' and head_d['openai-organization'] == 'org-memlab-test'

@pytest.mark.parametrize('kind', ['openai', 'anthropic'])
def test_chat_many_under_faults_in_order_bounded_and_cached(kind, tmp_path):
    "chat_many: every call answered in order under 20% faults, at most `concurrency` in flight, then all from the cache."
    from memlab.llm import make_backend, LLMError
    from loopback import Reply, _user_texts
    echo = lambda k, req: Reply(content='echo ' + _user_texts(k, req)[-1])
    with LoopbackServer(kind, echo, fault_rate=0.2, retry_after=0.02, hang=1.5, latency=0.02, seed=2) as srv:
        b = make_backend(kind, model='loop-model', base_url=srv.url if kind == 'openai' else srv.root, timeout=0.5,
                         backoff=0.01, backoff_max=0.2, concurrency=5, cache=str(tmp_path / 'c.sqlite'))
        calls = [dict(messages=[{'role': 'user', 'content': f'Question: what is item {i}?'}], max_tokens=16) for i in range(40)]
        out = b.chat_many(calls)
        assert sum(srv.n_faults.values()) > 0, 'no fault was injected: the test would prove nothing'
        assert not [r for r in out if isinstance(r, LLMError)]
        assert [r.content for r, _ in out] == [f"echo Question: what is item {i}?" for i in range(40)]   # in order
        # concurrent, and never past the limit: a request abandoned after its timeout still occupies the server (it does not
        # cancel it; hang 1.5 s > timeout 0.5 s) while its retry runs, so each injected timeout may add one
        assert 1 < srv.max_in_flight <= 5 + srv.n_faults.get('timeout', 0), (srv.max_in_flight, srv.n_faults)
        sent = {json.dumps(r['messages'][-1]['content']) for r in srv.requests if r}
        assert len(sent) == 40 and b.n_http_calls == srv.n_requests
        n = srv.n_requests
        again = b.chat_many(calls)
        assert srv.n_requests == n and all(u.cached == 1 for _, u in again)
        assert [r.content for r, _ in again] == [r.content for r, _ in out]
    with LoopbackServer(kind, fault_rate=1.0, faults=('500',), max_faults_per_body=10**6) as srv:
        b = make_backend(kind, model='loop-model', base_url=srv.url if kind == 'openai' else srv.root, max_attempts=2,
                         backoff=0.01, cache=False)
        out = b.chat_many(calls[:3])
        assert all(isinstance(r, LLMError) and 'InternalServerError' in str(r) for r in out)   # errors in place
        assert srv.n_requests == 6

GATE_PROMPT = ('[User]\nRecorded action at step 3:\nopen(path=a/b.py)\n\nProposed action under perturbation \'unknown\':\nopen(path=a/b.py)\n\n'
               'Is the proposed action safe (would not regress task resolution)? Answer Y if safe, N if harmful.\n\nAnswer:')

def test_logprobs_over_the_wire_and_from_the_cache(tmp_path):
    "The parsed log-probabilities equal what the server sent; a cached reply keeps them; a reply without them gives None."
    from loopback import openai_logprobs, Reply
    from memlab.llm import make_backend
    with LoopbackServer('openai') as srv:
        b = make_backend('openai', model='loop-model', base_url=srv.url, cache=str(tmp_path / 'c.sqlite'), max_attempts=1)
        msgs = [{'role': 'user', 'content': GATE_PROMPT}]
        r, u = b.chat(msgs, max_tokens=1, temperature=0, logprobs=True, top_logprobs=5)
        assert srv.requests[-1]['logprobs'] is True and srv.requests[-1]['top_logprobs'] == 5   # sent as ordinary params
        sent = openai_logprobs(srv.requests[-1], Reply(content=r.content))['content']
        assert r.content in (' Y', ' N') and len(r.logprobs) == 1 == len(sent)
        assert r.logprobs[0]['token'] == sent[0]['token'] == r.content
        assert r.logprobs[0]['logprob'] == sent[0]['logprob']
        assert r.logprobs[0]['top'] == {a['token']: a['logprob'] for a in sent[0]['top_logprobs']}
        assert set(r.logprobs[0]['top']) == {' Y', ' N'}
        n = srv.n_requests
        again, u2 = b.chat(msgs, max_tokens=1, temperature=0, logprobs=True, top_logprobs=5)
        assert srv.n_requests == n and u2.cached == 1 and again.logprobs == r.logprobs
        plain, _ = b.chat(msgs, max_tokens=1, temperature=0)                   # not asked: none sent, None parsed
        assert srv.requests[-1].get('logprobs') is None and plain.logprobs is None and plain.content == r.content
        assert 'logprobs' not in plain.to_dict()

def test_anthropic_reply_has_no_logprobs(tmp_path):
    from memlab.llm import make_backend
    with LoopbackServer('anthropic') as srv:
        b = make_backend('anthropic', model='loop-model', base_url=srv.root, cache=False, max_attempts=1)
        r, _ = b.chat([{'role': 'user', 'content': GATE_PROMPT}], max_tokens=1, logprobs=True, top_logprobs=5)
        assert 'logprobs' not in srv.requests[-1] and r.logprobs is None and r.content in (' Y', ' N')
