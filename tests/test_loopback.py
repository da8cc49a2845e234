"The loopback OpenAI / Anthropic server (tests/loopback.py) against the real installed SDKs, over HTTP."
import json, time, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import anthropic
import openai
import pytest

from loopback import LoopbackServer, Reply, default_responder, judge_reply, parse_evidence
from memlab.core import Query
from memlab.judge import (A3_USER_TEMPLATE, LME_DEFAULT_TEMPLATE, LLMJudge, LongMemEvalJudge, fill_template,
                          parse_label_json, parse_yes_no)

QUESTION = 'What is the name of my dog?'
PROMPT = f'Use search_memory to answer from memory.\nQuestion: {QUESTION}'
EVIDENCE = ('[1] Session date: 2023/05/01\nuser: I adopted a puppy last week and I named my dog Biscuit.\n\n'
            '[2] Session date: 2023/04/02\nuser: I like green tea in the morning.')
OA_TOOLS = [{'type': 'function', 'function': {
    'name': 'search_memory', 'description': 'Search the memory.',
    'parameters': {'type': 'object', 'properties': {'query': {'type': 'string'}}, 'required': ['query']}}}]
AN_TOOLS = [{'name': 'search_memory', 'description': 'Search the memory.',
             'input_schema': {'type': 'object', 'properties': {'query': {'type': 'string'}}, 'required': ['query']}}]


def oa_client(srv, **kw): return openai.OpenAI(base_url=srv.url, api_key='sk-test', **{'max_retries': 0, **kw})
def an_client(srv, **kw): return anthropic.Anthropic(base_url=srv.url, api_key='sk-ant-test', **{'max_retries': 0, **kw})

def ask(kind, client, text, **kw):
    "One plain (tool-less) call; returns the reply text."
    if kind == 'openai':
        r = client.chat.completions.create(model='gpt-test', messages=[{'role': 'user', 'content': text}], **kw)
        return r.choices[0].message.content
    r = client.messages.create(model='claude-test', max_tokens=64, messages=[{'role': 'user', 'content': text}], **kw)
    return r.content[0].text

def client_for(kind, srv, **kw): return (oa_client if kind == 'openai' else an_client)(srv, **kw)


# ------------------------------------------------------------------------------------------------- wiring
def test_bound_to_loopback_only():
    with LoopbackServer('openai') as o, LoopbackServer('anthropic') as a:
        for srv in (o, a):
            u = urlparse(srv.url)
            assert u.hostname == '127.0.0.1' and u.port == srv.port > 0
            assert srv._server.socket.getsockname()[0] == '127.0.0.1'
        assert o.url.endswith('/v1') and urlparse(a.url).path == ''   # the anthropic SDK adds /v1/messages itself


# ----------------------------------------------------------------------------------------- tool round trips
def test_openai_tool_call_round_trip():
    with LoopbackServer('openai') as srv:
        c = oa_client(srv, _strict_response_validation=True)   # the response must validate against the SDK's types
        msgs = [{'role': 'system', 'content': 'You answer from memory.'}, {'role': 'user', 'content': PROMPT}]
        r = c.chat.completions.create(model='gpt-test-1', messages=msgs, tools=OA_TOOLS)
        assert r.object == 'chat.completion' and r.model == 'gpt-test-1'
        ch = r.choices[0]
        assert ch.finish_reason == 'tool_calls' and ch.message.role == 'assistant' and ch.message.content is None
        (tc,) = ch.message.tool_calls
        assert tc.type == 'function' and tc.function.name == 'search_memory'
        assert json.loads(tc.function.arguments) == {'query': QUESTION}
        assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

        msgs += [{'role': 'assistant', 'content': '', 'tool_calls': [   # '' as memlab sends it: strict servers refuse null
                     {'id': tc.id, 'type': 'function',
                      'function': {'name': tc.function.name, 'arguments': tc.function.arguments}}]},
                 {'role': 'tool', 'tool_call_id': tc.id, 'content': EVIDENCE}]
        r2 = c.chat.completions.create(model='gpt-test-1', messages=msgs, tools=OA_TOOLS)
        assert r2.choices[0].finish_reason == 'stop' and r2.choices[0].message.tool_calls is None
        assert r2.choices[0].message.content == 'Answer: Biscuit'
        assert r2.usage.prompt_tokens > r.usage.prompt_tokens    # the evidence is counted
        assert srv.n_requests == 2 and srv.log == [('/v1/chat/completions', 200)] * 2
        assert srv.headers[0]['authorization'] == 'Bearer sk-test'


def test_anthropic_tool_use_round_trip():
    with LoopbackServer('anthropic') as srv:
        c = an_client(srv, _strict_response_validation=True)
        msgs = [{'role': 'user', 'content': PROMPT}]
        r = c.messages.create(model='claude-test-1', max_tokens=256, system='You answer from memory.',
                              messages=msgs, tools=AN_TOOLS)
        assert r.type == 'message' and r.role == 'assistant' and r.model == 'claude-test-1'
        assert r.stop_reason == 'tool_use' and r.stop_sequence is None
        (tu,) = r.content
        assert tu.type == 'tool_use' and tu.name == 'search_memory' and tu.input == {'query': QUESTION}
        assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0

        msgs += [{'role': 'assistant', 'content': [{'type': 'tool_use', 'id': tu.id, 'name': tu.name, 'input': tu.input}]},
                 {'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': tu.id,
                                               'content': [{'type': 'text', 'text': EVIDENCE}]}]}]
        r2 = c.messages.create(model='claude-test-1', max_tokens=256, system='You answer from memory.',
                               messages=msgs, tools=AN_TOOLS)
        assert r2.stop_reason == 'end_turn' and [b.type for b in r2.content] == ['text']
        assert r2.content[0].text == 'Answer: Biscuit'
        assert r2.usage.input_tokens > r.usage.input_tokens
        assert srv.log == [('/v1/messages', 200)] * 2
        h = srv.headers[0]   # anthropic 2.x sends the API key as a Bearer token and a 2026 API version
        assert h['authorization'] == 'Bearer sk-ant-test' and h['anthropic-version'] == anthropic._constants.ANTHROPIC_API_VERSION


def test_no_evidence_abstains_and_question_fallback():
    req = {'tools': OA_TOOLS, 'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'Where do I live?'}]},
                                            {'role': 'tool', 'tool_call_id': 'x', 'content': 'No results.'}]}
    assert default_responder('openai', req) == Reply(content="Answer: I don't know")
    req['messages'] = req['messages'][:1]    # no `Question:` line: the whole first user message is the query
    assert default_responder('openai', req).tool_calls == [('search_memory', {'query': 'Where do I live?'})]
    ev = parse_evidence(EVIDENCE)
    assert [(e.session_id, e.rank, e.date) for e in ev] == [('e1', 0, '2023/05/01'), ('e2', 1, '2023/04/02')]
    assert ev[1].text == 'user: I like green tea in the morning.'


# --------------------------------------------------------------------------------------------- judge calls
def test_fake_judge_replies_follow_memlab_prompts():
    a3 = lambda gold, gen: fill_template(A3_USER_TEMPLATE, question='Q?', gold_answer=gold, generated_answer=gen)
    assert json.loads(judge_reply(a3('Biscuit', 'Your dog is called biscuit.'))) == {'label': 'CORRECT'}
    assert json.loads(judge_reply(a3('Biscuit', "I don't know"))) == {'label': 'WRONG'}
    assert judge_reply(LME_DEFAULT_TEMPLATE.format('Q?', 'May 1, 2023', 'It was on may 1 2023.')) == 'yes'
    assert judge_reply(LME_DEFAULT_TEMPLATE.format('Q?', 'May 1, 2023', 'It was in June.')) == 'no'
    assert judge_reply('Say something.') == 'OK'


@pytest.mark.parametrize('kind', ['openai', 'anthropic'])
def test_memlab_judges_through_sdk(kind):
    q = Query(id='q1', question=QUESTION, answers=['Biscuit'], qtype='single-session-user')
    with LoopbackServer(kind) as srv:
        c = client_for(kind, srv)
        def complete(messages):   # the judge's OpenAI-style messages, sent through the provider's SDK
            if kind == 'openai':
                return c.chat.completions.create(model='judge', messages=messages).choices[0].message.content
            system = '\n'.join(m['content'] for m in messages if m['role'] == 'system')
            rest = [m for m in messages if m['role'] != 'system']
            return c.messages.create(model='judge', max_tokens=32, messages=rest,
                                     **({'system': system} if system else {})).content[0].text
        j, lme = LLMJudge(complete), LongMemEvalJudge(complete)
        assert parse_label_json(complete(j.messages(q, 'Biscuit, my puppy'))) == 'CORRECT'
        assert parse_label_json(complete(j.messages(q, 'Rex'))) == 'WRONG'
        assert parse_yes_no(complete(lme.messages(q, 'It is Biscuit.'))) == 'CORRECT'
        assert parse_yes_no(complete(lme.messages(q, 'Rex.'))) == 'WRONG'


# ------------------------------------------------------------------------------------------------- faults
EXPECTED = {  # fault -> exact exception class raised by each SDK with max_retries=0
    ('openai', '429'): openai.RateLimitError, ('openai', '500'): openai.InternalServerError,
    ('openai', 'timeout'): openai.APITimeoutError, ('openai', 'truncated'): openai.APIConnectionError,
    ('anthropic', '429'): anthropic.RateLimitError, ('anthropic', '500'): anthropic.InternalServerError,
    ('anthropic', 'timeout'): anthropic.APITimeoutError, ('anthropic', 'truncated'): anthropic.APIConnectionError,
}

@pytest.mark.parametrize('kind,fault', sorted(EXPECTED))
def test_fault_seen_by_sdk_as(kind, fault):
    import httpx2
    with LoopbackServer(kind, fault_rate=1.0, faults=(fault,), hang=2.0) as srv:
        with pytest.raises(EXPECTED[kind, fault]) as ei:
            ask(kind, client_for(kind, srv, timeout=0.5), 'hello')
        assert type(ei.value) is EXPECTED[kind, fault]     # exactly, not a subclass
        assert srv.n_faults[fault] == 1 and srv.n_requests == 1
        if fault in ('429', '500'):
            path = '/v1/chat/completions' if kind == 'openai' else '/v1/messages'
            assert ei.value.status_code == int(fault) and srv.log == [(path, int(fault))]
            body = ei.value.body   # openai unwraps {"error": {...}}; anthropic keeps the whole envelope
            assert (body['type'] if kind == 'openai' else body['error']['type']) == {
                ('openai', '429'): 'requests', ('openai', '500'): 'server_error',
                ('anthropic', '429'): 'rate_limit_error', ('anthropic', '500'): 'api_error'}[kind, fault]
        if fault == '429':
            assert ei.value.response.headers['retry-after'] == '0.05' and ei.value.response.headers['retry-after-ms'] == '50'
        if fault == 'timeout': assert isinstance(ei.value.__cause__, httpx2.ReadTimeout)
        if fault == 'truncated':   # status 200, Content-Length of the full body, half of it sent, connection closed
            assert isinstance(ei.value.__cause__, httpx2.RemoteProtocolError)
            assert 'peer closed connection without sending complete message body' in str(ei.value.__cause__)
            assert srv.log[0][1] == 200


@pytest.mark.parametrize('kind', ['openai', 'anthropic'])
def test_retry_after_is_honoured(kind):
    # two 429s then success; SDK backoff without Retry-After would sleep >= 0.375 + 0.75 s
    with LoopbackServer(kind, fault_rate=1.0, faults=('429',), retry_after=0.05, max_faults_per_body=2) as srv:
        c, waits = client_for(kind, srv, max_retries=2), []
        chosen = c._calculate_retry_timeout                # the SDK's own choice of wait before each retry
        c._calculate_retry_timeout = lambda *a, **kw: waits.append(chosen(*a, **kw)) or waits[-1]
        assert ask(kind, c, 'hello') == 'OK'
        assert waits == [0.05, 0.05], waits                # the server's Retry-After, not the SDK's backoff
        assert srv.n_requests == 3 and [s for _, s in srv.log] == [429, 429, 200]
        assert [h['x-stainless-retry-count'] for h in srv.headers] == ['0', '1', '2']


def test_openai_does_not_retry_when_retry_after_exceeds_two_minutes():
    with LoopbackServer('openai', fault_rate=1.0, faults=('429',), retry_after=121) as srv:
        with pytest.raises(openai.RateLimitError): ask('openai', oa_client(srv, max_retries=3), 'hello')
        assert srv.n_requests == 1


def test_fault_draws_are_deterministic_and_retries_pass():
    def statuses(seed):
        with LoopbackServer('openai', fault_rate=0.5, faults=('429', '500'), seed=seed) as srv:
            out = []
            for i in range(12):
                for attempt in range(4):   # bounded: max_faults_per_body=3 guarantees the 4th attempt passes
                    req = urllib.request.Request(srv.url + '/chat/completions', method='POST',
                                                 data=json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': f'q{i}'}]}).encode(),
                                                 headers={'Content-Type': 'application/json'})
                    try: urllib.request.urlopen(req, timeout=5).read(); out.append(200); break
                    except urllib.error.HTTPError as e: out.append(e.code)
                else: raise AssertionError('a request kept failing')
            return out, dict(srv.n_faults)
    a, b, c = statuses(0), statuses(0), statuses(1)
    assert a == b and a != c and 200 in a[0] and 429 in a[0] and 500 in a[0]


@pytest.mark.parametrize('kind', ['openai', 'anthropic'])
def test_sdk_retries_ride_out_faults(kind):
    n = 30
    with LoopbackServer(kind, fault_rate=0.3, hang=1.0, seed=3) as srv:
        c = client_for(kind, srv, max_retries=5, timeout=0.5)
        with ThreadPoolExecutor(n) as ex:   # concurrent so SDK backoffs (0.5-1 s) overlap
            replies = list(ex.map(lambda i: ask(kind, c, f'{PROMPT} #{i}'), range(n)))
        assert replies == ['OK'] * n
        assert srv.n_requests > n
        assert sum(srv.n_faults.values()) == srv.n_requests - n    # each injected fault cost exactly one retry
        assert sum(v > 0 for v in srv.n_faults.values()) >= 3


# -------------------------------------------------------------------------------------------- concurrency
@pytest.mark.parametrize('kind', ['openai', 'anthropic'])
def test_concurrent_calls_overlap(kind):
    threads, calls, latency = 64, 2, 0.1
    with LoopbackServer(kind, latency=latency) as srv:
        c = client_for(kind, srv)
        with ThreadPoolExecutor(threads) as ex:
            out = list(ex.map(lambda i: [ask(kind, c, f'hello {i} {j}') for j in range(calls)], range(threads)))
        assert out == [['OK'] * calls] * threads and srv.n_requests == threads * calls
        assert srv.max_in_flight > 1, srv.max_in_flight                  # requests were in flight together


def test_strict_server_refuses_null_content_as_llama_cpp_does():
    "The loopback server is as strict as llama-cpp-python's: a message whose content is null gets HTTP 500."
    import openai
    with LoopbackServer('openai') as srv:
        c = openai.OpenAI(base_url=srv.url, api_key='sk-test', max_retries=0)
        bad = [{'role': 'user', 'content': 'Q'}, {'role': 'assistant', 'content': None}, {'role': 'user', 'content': 'again'}]
        with pytest.raises(openai.InternalServerError, match='Input should be a valid string'):
            c.chat.completions.create(model='m', messages=bad)
    with LoopbackServer('openai', strict=False) as srv:
        c = openai.OpenAI(base_url=srv.url, api_key='sk-test', max_retries=0)
        assert c.chat.completions.create(model='m', messages=bad).choices[0].message.content
