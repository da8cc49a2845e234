"""Judges call the model as the benchmarks' official code does: LongMemEval's evaluate_qa.py (temperature 0,
max_tokens 10), MemoryAgentBench's longmem_qa_evaluate.py (the same, with the answer list shown as it is:
`Correct Answer: ['28']`), seed 000's A.3 judge with a small reply limit. Checked on the requests a real HTTP
server (the loopback OpenAI server, 127.0.0.1) receives from `build_judge`, the path `memlab score` takes."""
import pytest

from loopback import LoopbackServer
from memlab.core import Query
from memlab.runner import build_judge


def user_text(req: dict) -> str:
    return '\n'.join(m['content'] for m in req['messages'] if m['role'] == 'user')


@pytest.fixture(scope='module')
def srv():
    with LoopbackServer('openai') as s: yield s


def backend(srv):
    return {'name': 'openai', 'model': 'judge-model', 'base_url': srv.url, 'api_key_env': 'MEMLAB_TEST_KEY', 'cache': False}


def test_longmemeval_judge_sends_official_settings(srv, monkeypatch):
    monkeypatch.setenv('MEMLAB_TEST_KEY', 'sk-test')
    j = build_judge({'name': 'longmemeval', 'backend': backend(srv)})
    q = Query(id='q1', question='How many days?', answers=['28'], qtype='temporal-reasoning')
    n = len(srv.requests); j.judge('r1', q, '28 days')
    req = srv.requests[n]
    assert (req['temperature'], req['max_tokens']) == (0.0, 10)
    assert 'Correct Answer: 28\n' in user_text(req)


def test_mab_longmemeval_judge_shows_the_answer_list(srv, monkeypatch):
    monkeypatch.setenv('MEMLAB_TEST_KEY', 'sk-test')
    import memlab.protocols.mab.agents   # noqa: F401  (registers mab-metric)
    j = build_judge({'name': 'mab-metric', 'catalogue': 'synthetic', 'backend': backend(srv)})
    q = Query(id='q1', question='How many days?', answers=['28'], qtype='temporal-reasoning', task='longmemeval_s*')
    n = len(srv.requests); j.judge('r1', q, '28 days')
    req = srv.requests[n]
    assert "Correct Answer: ['28']" in user_text(req), user_text(req)
    assert (req['temperature'], req['max_tokens']) == (0.0, 10)


def test_a3_judge_has_a_reply_limit(srv, monkeypatch):
    monkeypatch.setenv('MEMLAB_TEST_KEY', 'sk-test')
    j = build_judge({'name': 'llm-a3', 'backend': backend(srv)})
    n = len(srv.requests); j.judge('r1', Query(id='q', question='Where?', answers=['Paris']), 'Paris')
    assert srv.requests[n]['max_tokens'] == 256
    j = build_judge({'name': 'llm-a3', 'max_tokens': None, 'backend': backend(srv)})
    n = len(srv.requests); j.judge('r1', Query(id='q', question='Where?', answers=['Paris']), 'Paris')
    assert 'max_tokens' not in srv.requests[n]


def test_score_with_the_locomo_judge_from_the_cli(tmp_path):
    "`memlab score STORE --judge locomo` scores a LoCoMo run with the official rules (it failed before the judge existed)."
    import yaml
    from pathlib import Path
    from inproc import memlab_main
    from memlab.runner import ResultsStore
    fx = Path(__file__).parent / 'fixtures' / 'locomo10.json'
    cfg = tmp_path / 'loc.yaml'
    cfg.write_text(yaml.safe_dump({'name': 'loc', 'dataset': {'kind': 'locomo', 'path': str(fx)},
                                   'policies': [{'name': 'offline-reader', 'tier': 'strong'}], 'memories': [{'name': 'bm25', 'k': 12}]}))
    store = tmp_path / 'store'
    r = memlab_main(['run', cfg, '--store', store]); assert r['rc'] == 0, r['out']
    r = memlab_main(['score', store, '--judge', 'locomo']); assert r['rc'] == 0, r['out']
    sc = ResultsStore(store).scores()
    assert set(sc['judge']) == {'locomo'} and sc['score'].between(0, 1).all() and len(sc) == 16
    assert (sc['score'] == sc['score'].round(3)).all()                  # stored rounded, as the official files


def test_report_names_the_judge_when_a_store_has_several(tmp_path):
    "After two judges, `memlab report` failed with a traceback and had no --judge: now exit 2 naming --judge, and --judge picks one."
    import yaml
    from inproc import memlab_main
    cfg = tmp_path / 'c.yaml'
    cfg.write_text(yaml.safe_dump({'name': 'two', 'dataset': {'kind': 'synthetic', 'params': {'n_instances': 1, 'queries_per_instance': 4, 'n_filler': 4}},
                                   'policies': [{'name': 'offline-reader'}], 'memories': [{'name': 'bm25'}]}))
    store = tmp_path / 's'
    assert memlab_main(['run', cfg, '--store', store, '--score'])['rc'] == 0
    fx = memlab_main(['score', store, '--judge', 'locomo'])            # synthetic queries have no LoCoMo category: errors, still a pass
    assert fx['rc'] == 0, fx['out']
    r = memlab_main(['report', store])
    assert r['rc'] == 2 and 'several judges' in r['err'] and '--judge' in r['err'] and len(r['err'].strip().splitlines()) == 1, r['err']
    r = memlab_main(['report', store, '--judge', 'offline-match'])
    assert r['rc'] == 0 and 'offline reader (no LLM)' in r['out'], r['out']
