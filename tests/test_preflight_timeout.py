"""Issue 25, item 3b: the pre-flight request gets the backend's configured timeout (it was capped at 20 s, so a busy CPU
server configured with `timeout: 300` failed the run with exit 2), and its failure says how to skip the check."""
import pytest
import yaml

from inproc import memlab_main
from loopback import LoopbackServer
from memlab.llm import OpenAIBackend, PreflightError


def test_the_probe_gets_the_configured_timeout(monkeypatch):
    "The timeout the one request is sent with: the spec's 300 s, not min(300, 20)."
    b = OpenAIBackend('loop-model', base_url='http://127.0.0.1:9/v1', cache=False, timeout=300)
    seen = []
    monkeypatch.setattr(b, '_probe', lambda req, timeout: seen.append(timeout))
    b.preflight()
    b.preflight(timeout=7)
    assert seen == [300, 7], seen


def test_a_slow_server_within_the_timeout_passes():
    with LoopbackServer('openai', latency=1.5) as srv:
        b = OpenAIBackend('loop-model', base_url=srv.url, cache=False, timeout=3)
        out = b.preflight()
    assert srv.n_requests == 1 and out['latency_s'] >= 1.5, out


def test_a_server_slower_than_the_timeout_fails_naming_no_preflight():
    with LoopbackServer('openai', latency=3) as srv:
        b = OpenAIBackend('loop-model', base_url=srv.url, cache=False, timeout=0.5)
        with pytest.raises(PreflightError) as e: b.preflight()
    msg = str(e.value)
    assert '\n' not in msg and 'timed out after 0.5 s' in msg and '--no-preflight' in msg and b.n_http_calls == 1, msg


def test_the_cli_exit_2_line_names_no_preflight(tmp_path):
    with LoopbackServer('openai', latency=3) as srv:
        cfg = dict(name='pf', section='pf', dataset={'kind': 'synthetic', 'params': {'n_instances': 1, 'queries_per_instance': 2, 'n_filler': 3}},
                   policies=[{'name': 'llm', 'backend': {'name': 'openai', 'model': 'loop-model', 'base_url': srv.url, 'timeout': 0.5,
                                                         'max_attempts': 1, 'cache': False}}],
                   memories=[{'name': 'bm25', 'k': 5}])
        (tmp_path / 'c.yaml').write_text(yaml.safe_dump(cfg))
        r = memlab_main(['run', tmp_path / 'c.yaml', '--store', tmp_path / 's'])
    assert r['rc'] == 2 and r['err'].count('\n') == 1 and 'memlab run --no-preflight' in r['err'], r['out']
    assert not (tmp_path / 's').exists()
