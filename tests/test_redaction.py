"""A server that echoes the API key in its error body never gets the key into memlab's errors or logs.

The loopback server answers 401 (or 500) with the request's Authorization / x-api-key header quoted in the body.
With a fake key in the environment, a backend call fails with an `LLMError` whose text (and any log record)
lacks the key and names the variable instead: `[REDACTED:<VARIABLE>]`. Both SDKs, both transports, a variable
with an arbitrary name (registered by the backend) and the provider's default one, and `preflight()`.
"""
import logging
import pytest
from loopback import LoopbackServer
from memlab.llm import LLMError, make_backend

FAKE = 'sk-memlab-redaction-test-5e2b91c4'
MSGS = [{'role': 'user', 'content': 'Question: what is my dog called?'}]

def echoing(kind, status):
    return LoopbackServer(kind, fault_rate=1.0, faults=(status,), max_faults_per_body=10**6, echo_auth=True)

def check(text: str, var: str):
    assert FAKE not in text, f'the key leaked: {text}'
    assert f'[REDACTED:{var}]' in text, text

@pytest.mark.parametrize('status', ['401', '500'])
@pytest.mark.parametrize('transport', ['aiohttp', 'httpx'])
@pytest.mark.parametrize('kind', ['openai', 'anthropic'])
def test_echoed_key_is_redacted_from_errors(kind, transport, status, monkeypatch, caplog):
    var = 'MEMLAB_TEST_CRED_VAR'                    # no secret-looking suffix: the backend must register it
    monkeypatch.setenv(var, FAKE)
    with echoing(kind, status) as srv, caplog.at_level(logging.DEBUG):
        b = make_backend(kind, model='loop-model', base_url=srv.url, api_key_env=var, cache=False, transport=transport,
                         max_attempts=2, backoff=0.01)
        with pytest.raises(LLMError) as e: b.chat(MSGS)
        sent = [h.get('authorization', '') + h.get('x-api-key', '') for h in srv.headers]
    assert sent and all(FAKE in s for s in sent), 'the key was not sent: the test would prove nothing'
    assert 'received credentials' in str(e.value) and status in str(e.value)   # the server's body is kept, minus the key
    check(str(e.value) + repr(e.value) + str(e.value.args), var)
    assert FAKE not in caplog.text

def test_default_key_variable_and_preflight_are_redacted(monkeypatch):
    monkeypatch.setenv('OPENAI_API_KEY', FAKE)
    with echoing('openai', '401') as srv:
        b = make_backend('openai', model='loop-model', base_url=srv.url, cache=False)
        with pytest.raises(LLMError) as e: b.chat(MSGS)
        check(str(e.value), 'OPENAI_API_KEY')
        from memlab.llm import PreflightError
        with pytest.raises(PreflightError) as e: b.preflight()
        check(str(e.value), 'OPENAI_API_KEY')
        assert '\n' not in str(e.value) and 'HTTP 401' in str(e.value)
