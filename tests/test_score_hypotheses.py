"""`memlab score-hypotheses`: answers produced by any system, scored with the benchmark's own judge and aggregation
(LongMemEval's evaluate_qa.py judge and print_qa_metrics.py; LoCoMo's evaluation.py rules over its output files)."""
import json
from pathlib import Path

import pytest

from inproc import memlab_main
from loopback import LoopbackServer

FX = Path(__file__).parent / 'fixtures'


def test_longmemeval_hypotheses_with_the_official_judge(tmp_path, monkeypatch):
    monkeypatch.setenv('MEMLAB_TEST_KEY', 'sk-test'); monkeypatch.setenv('MEMLAB_CACHE', str(tmp_path / 'c.sqlite'))
    recs = json.loads((FX / 'longmemeval_s_cleaned.json').read_text())
    hyp = tmp_path / 'hyp.jsonl'
    hyp.write_text('\n'.join(json.dumps({'question_id': r['question_id'], 'hypothesis': str(r['answer'])}) for r in recs))
    with LoopbackServer('openai') as srv:
        r = memlab_main(['score-hypotheses', 'longmemeval', FX / 'longmemeval_s_cleaned.json', hyp, '--judge-model', 'loop-judge',
                         '--base-url', srv.url, '--api-key-env', 'MEMLAB_TEST_KEY', '--out', tmp_path / 'eval.jsonl'])
        assert r['rc'] == 0, r['out']
        assert srv.requests and all(q['max_tokens'] == 10 and q['temperature'] == 0 for q in srv.requests)
    assert 'task-averaged' in r['out'] and 'overall' in r['out'] and 'abstention' in r['out']
    lines = [json.loads(l) for l in (tmp_path / 'eval.jsonl').read_text().splitlines()]
    assert len(lines) == len(recs) and all(set(l['autoeval_label']) == {'model', 'label'} for l in lines)


def test_locomo_output_file_with_the_locomo_judge(tmp_path):
    data = json.loads((FX / 'locomo10.json').read_text())
    for s in data:
        for j, qa in enumerate(s['qa']): qa['sys_prediction'] = str(qa.get('answer', 'Not mentioned in the conversation')) if j % 2 else 'no idea'
    out = tmp_path / 'locomo_out.json'; out.write_text(json.dumps(data))
    r = memlab_main(['score-hypotheses', 'locomo', FX / 'locomo10.json', out, '--prediction-key', 'sys_prediction'])
    assert r['rc'] == 0, r['out']
    assert 'LoCoMo official F1' in r['out'] and 'overall' in r['out'] and 'single-hop' in r['out']


@pytest.mark.parametrize('record, message', [({'question_id': 'nope', 'hypothesis': 'x'}, "field 'question_id': not a question of the dataset"),
                                             ({'hypothesis': 'x'}, "field 'question_id' is missing")])
def test_bad_hypotheses_are_one_line_and_exit_2_before_any_call(tmp_path, record, message):
    hyp = tmp_path / 'hyp.jsonl'; hyp.write_text(json.dumps(record))
    with LoopbackServer('openai') as srv:
        r = memlab_main(['score-hypotheses', 'longmemeval', FX / 'longmemeval_s_cleaned.json', hyp, '--judge-model', 'm',
                         '--base-url', srv.url, '--out', tmp_path / 'eval.jsonl'])
        assert srv.n_requests == 0
    assert r['rc'] == 2 and message in r['err'] and len(r['err'].strip().splitlines()) == 1, r['err']
    assert not (tmp_path / 'eval.jsonl').exists()
