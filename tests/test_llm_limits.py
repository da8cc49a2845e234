"""Bounded waits, clear connection errors, pre-flight checks and a cap on cached reply size, against real servers.

- a 429 with `Retry-After: 3600` fails at once (the wait is beyond the retry budget), saying how long the server
  asked to wait, instead of sleeping 5 x 30 s; a budget bounds a call's retries in time as well as in number;
- a refused connection (a port with nothing listening) is reported as 'connection refused' with host:port, over
  every transport, and is retried within the budget;
- `ChatBackend.preflight()` passes against a live server with one tiny uncached request, and fails with a
  one-line `PreflightError` (provider, model, base_url, cause) for a refused port, an HTTP 401, a timeout or
  a missing key;
- a reply larger than the cache's cap (`cache_max_reply_bytes` in the backend spec) is returned but not stored.
"""
import socket, time, warnings
import pytest
from loopback import LoopbackServer, Reply
from memlab.llm import OpenAIBackend, AnthropicBackend, LLMError, make_backend
from memlab.cache import CacheWarning

MSGS = [{'role': 'user', 'content': 'Question: what is my dog called?'}]

def dead_port() -> int:
    "A port with nothing listening: bound, then closed."
    s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()
    return port

def failing(status, **kw):
    return LoopbackServer('openai', fault_rate=1.0, faults=(status,), max_faults_per_body=10**6, **kw)


@pytest.mark.parametrize('transport', list(OpenAIBackend.TRANSPORTS))
def test_retry_after_beyond_the_budget_fails_fast(transport):
    with failing('429', retry_after=3600) as srv:
        b = OpenAIBackend('loop-model', base_url=srv.url, cache=False, transport=transport)    # default budget and backoff
        t0 = time.monotonic()
        with pytest.raises(LLMError) as e: b.chat(MSGS)
        took = time.monotonic() - t0
    msg = str(e.value)
    assert took < 3, f'{took:.1f} s: the call slept instead of failing fast ({msg})'
    assert 'asked to wait 3600 s' in msg and 'RateLimitError' in msg, msg
    assert srv.n_requests == 1
    info = b.info()
    assert info['retry_budget_s'] == 120 and info['max_consecutive_failures'] == 20 and info['max_attempts'] == 6

def test_retry_budget_bounds_a_call_in_time():
    with failing('500') as srv:
        b = OpenAIBackend('loop-model', base_url=srv.url, cache=False, max_attempts=1000, backoff=0.2, backoff_max=0.3,
                          retry_budget_s=1.5)
        t0 = time.monotonic()
        with pytest.raises(LLMError, match='InternalServerError') as e: b.chat(MSGS)
        took = time.monotonic() - t0
    assert 0.9 < took < 3, took
    assert 2 < srv.n_requests < 50 and 'retry budget' in str(e.value), (srv.n_requests, str(e.value))

def test_retry_after_within_the_budget_is_honoured():
    with LoopbackServer('openai', fault_rate=1.0, faults=('429',), retry_after=0.4, max_faults_per_body=2) as srv:
        b = OpenAIBackend('loop-model', base_url=srv.url, cache=False, backoff_max=0.05, retry_budget_s=10)
        t0 = time.monotonic(); r, _ = b.chat(MSGS); took = time.monotonic() - t0
    assert r.content and srv.n_requests == 3
    assert took >= 0.75, took          # two waits of 0.4 s as the server asked, not backoff_max=0.05


@pytest.mark.parametrize('transport', list(OpenAIBackend.TRANSPORTS))
def test_connection_refused_is_named(transport):
    port = dead_port()
    b = OpenAIBackend('loop-model', base_url=f'http://127.0.0.1:{port}/v1', cache=False, transport=transport,
                      max_attempts=2, backoff=0.01)
    with pytest.raises(LLMError) as e: b.chat(MSGS)
    msg = str(e.value)
    assert f'connection refused by 127.0.0.1:{port}' in msg and 'timed out' not in msg.lower(), msg
    assert b.n_http_calls == 2                                              # retried

@pytest.mark.parametrize('transport', list(OpenAIBackend.TRANSPORTS))
def test_connection_refused_is_retried_within_the_budget(transport):
    port = dead_port()
    b = OpenAIBackend('loop-model', base_url=f'http://127.0.0.1:{port}/v1', cache=False, transport=transport,
                      max_attempts=1000, backoff=0.1, backoff_max=0.2, retry_budget_s=1.5)
    with pytest.raises(LLMError, match='connection refused') as e: b.chat(MSGS)
    assert 'retry budget of 1.5 s used up' in str(e.value) and 2 < b.n_http_calls < 1000   # retried; the budget, not the attempt cap, stopped it


@pytest.mark.parametrize('kind,transport', [(k, t) for k, c in (('openai', OpenAIBackend), ('anthropic', AnthropicBackend)) for t in c.TRANSPORTS])
def test_preflight_passes_against_a_live_server(kind, transport, tmp_path):
    with LoopbackServer(kind) as srv:
        b = make_backend(kind, model='loop-model', base_url=srv.url, cache=str(tmp_path / 'c.sqlite'), transport=transport)
        out = b.preflight()
        assert srv.n_requests == 1 and srv.requests[0]['max_tokens'] == 1
        assert out['provider'] == kind and out['model'] == 'loop-model' and out['latency_s'] >= 0
        assert len(b.cache) == 0                                             # uncached
        b.preflight(); assert srv.n_requests == 2

@pytest.mark.parametrize('transport', list(OpenAIBackend.TRANSPORTS))
def test_preflight_refused_port(transport):
    from memlab.llm import PreflightError
    port = dead_port(); url = f'http://127.0.0.1:{port}/v1'
    b = OpenAIBackend('loop-model', base_url=url, cache=False, transport=transport)
    with pytest.raises(PreflightError) as e: b.preflight()
    msg = str(e.value)
    assert b.n_http_calls == 1                                              # no retries
    assert '\n' not in msg and all(s in msg for s in ('openai', 'loop-model', url, f'connection refused by 127.0.0.1:{port}')), msg
    assert isinstance(e.value, LLMError)

def test_preflight_http_401_and_timeout():
    from memlab.llm import PreflightError
    with failing('401') as srv:
        b = OpenAIBackend('loop-model', base_url=srv.url, cache=False)
        with pytest.raises(PreflightError) as e: b.preflight()
        assert srv.n_requests == 1                                            # not retried
    msg = str(e.value)
    assert '\n' not in msg and 'HTTP 401' in msg and 'Incorrect API key' in msg and srv.url in msg, msg
    with LoopbackServer('openai', latency=5) as srv:
        b = OpenAIBackend('loop-model', base_url=srv.url, cache=False, timeout=60)
        with pytest.raises(PreflightError, match='timed out') as e: b.preflight(timeout=0.5)
        assert '\n' not in str(e.value) and b.n_http_calls == 1                 # the preflight's own timeout, no retries

def test_preflight_without_a_key(monkeypatch):
    from memlab.llm import PreflightError
    monkeypatch.delenv('MEMLAB_NO_SUCH_KEY', raising=False)
    b = OpenAIBackend('gpt-4o-mini', api_key_env='MEMLAB_NO_SUCH_KEY', cache=False)        # the provider's URL: a key is needed
    with pytest.raises(PreflightError, match='MEMLAB_NO_SUCH_KEY is not set') as e: b.preflight()
    assert '\n' not in str(e.value) and b.n_http_calls == 0


def test_large_replies_are_returned_but_not_cached(tmp_path):
    big = 'x' * 5_000_000
    path = tmp_path / 'c.sqlite'
    with LoopbackServer('openai', lambda k, req: Reply(content=big if 'big' in str(req['messages']) else 'small')) as srv:
        b = make_backend('openai', model='loop-model', base_url=srv.url, cache=str(path), cache_max_reply_bytes=1_000_000)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            out = [b.chat([{'role': 'user', 'content': f'big {i}'}])[0].content for i in range(3)]
            small = b.chat([{'role': 'user', 'content': 'small one'}])[0].content
        assert out == [big] * 3 and small == 'small'                         # returned to the caller
        notes = [str(x.message) for x in w if issubclass(x.category, CacheWarning)]
        assert len(notes) == 1 and 'max_reply_bytes' in notes[0], notes      # reported once
        assert len(b.cache) == 1 and path.stat().st_size < 1_000_000          # only the small reply was stored
        assert b.cache.incidents['too_large'] == 3 and b.info()['cache_max_reply_bytes'] == 1_000_000
        n = srv.n_requests
        b.chat([{'role': 'user', 'content': 'big 0'}]); b.chat([{'role': 'user', 'content': 'small one'}])
        assert srv.n_requests == n + 1                                        # the big one is fetched again, the small one not
    from memlab.cache import ResponseCache
    assert ResponseCache(tmp_path / 'default.sqlite').max_reply_bytes == 2 ** 20
