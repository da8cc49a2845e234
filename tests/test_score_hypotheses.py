"""`memlab score-hypotheses`: answers produced by any system, scored with the benchmark's own judge and aggregation
(LongMemEval's evaluate_qa.py judge and print_qa_metrics.py; LoCoMo's evaluation.py rules over its output files)."""
import json
from pathlib import Path

import pytest

from inproc import memlab_main
from loopback import LoopbackServer, Reply, default_responder

FX = Path(__file__).parent / 'fixtures'


def strict(text: str):
    "JSON as a strict parser reads it: NaN / Infinity are errors."
    def no(c): raise ValueError(f'not strict JSON: {c}')
    return json.loads(text, parse_constant=no)


def unparsed_for_marked(kind, req):
    "The loopback judge, except that it answers 'Correct' (no yes, no no) to a marked response."
    text = json.dumps(req)
    return Reply(content='Correct') if 'Model Response: MARK' in text else default_responder(kind, req)


def test_longmemeval_hypotheses_with_the_official_judge(tmp_path, monkeypatch):
    monkeypatch.setenv('MEMLAB_TEST_KEY', 'sk-test'); monkeypatch.setenv('MEMLAB_CACHE', str(tmp_path / 'c.sqlite'))
    recs = json.loads((FX / 'longmemeval_s_cleaned.json').read_text())
    hyps = [{'question_id': r['question_id'], 'hypothesis': 'MARK' if k % 3 == 0 else str(r['answer'])} for k, r in enumerate(recs)][::-1]
    hyp = tmp_path / 'hyp.jsonl'
    hyp.write_text('\n'.join(json.dumps(h) for h in hyps))
    with LoopbackServer('openai', responder=unparsed_for_marked) as srv:
        r = memlab_main(['score-hypotheses', 'longmemeval', FX / 'longmemeval_s_cleaned.json', hyp, '--judge-model', 'loop-judge',
                         '--base-url', srv.url, '--api-key-env', 'MEMLAB_TEST_KEY', '--out', tmp_path / 'eval.jsonl'])
        assert r['rc'] == 0, r['out']
        assert srv.requests and all(q['max_tokens'] == 10 and q['temperature'] == 0 for q in srv.requests)
    assert 'task-averaged' in r['out'] and 'overall' in r['out'] and 'abstention' in r['out'] and 'accuracy_parsed_only' in r['out']
    lines = [strict(l) for l in (tmp_path / 'eval.jsonl').read_text().splitlines()]
    # evaluate_qa.py's eval-results lines: the input records in input order, then autoeval_label; memlab's fields after
    assert [l['question_id'] for l in lines] == [h['question_id'] for h in hyps]
    assert all(list(l) == ['question_id', 'hypothesis', 'autoeval_label', 'memlab'] for l in lines)
    assert all(l['autoeval_label'] == {'model': 'loop-judge', 'label': l['autoeval_label']['label']} for l in lines)
    marked = [l for l in lines if l['hypothesis'] == 'MARK']
    assert marked and all(l['autoeval_label']['label'] is False and l['memlab']['n_unparsed'] == 1
                          and l['memlab']['correct'] == 0.0 and l['memlab']['correct_parsed_only'] is None
                          for l in marked)                         # 'Correct' has no 'yes': officially wrong, not left out
    overall = next(x for x in r['out'].splitlines() if x.split()[:1] == ['overall'])
    assert float(overall.split()[1]) == round(sum(l['autoeval_label']['label'] for l in lines) / len(lines), 4)


def test_locomo_output_file_with_the_locomo_judge(tmp_path):
    data = json.loads((FX / 'locomo10.json').read_text())
    for s in data:
        for j, qa in enumerate(s['qa']): qa['sys_prediction'] = str(qa.get('answer', 'Not mentioned in the conversation')) if j % 2 else 'no idea'
    out = tmp_path / 'locomo_out.json'; out.write_text(json.dumps(data))
    r = memlab_main(['score-hypotheses', 'locomo', FX / 'locomo10.json', out, '--prediction-key', 'sys_prediction', '--out', tmp_path / 'scored.json'])
    assert r['rc'] == 0, r['out']
    assert 'LoCoMo official F1' in r['out'] and 'overall' in r['out'] and 'single-hop' in r['out']
    # task_eval/evaluate_qa.py's output file: [{sample_id, qa}], each QA item with <model>_f1 (3 decimals), no autoeval_label
    scored = strict((tmp_path / 'scored.json').read_text())
    assert [list(s) for s in scored] == [['sample_id', 'qa']] * len(data) and [s['sample_id'] for s in scored] == [s['sample_id'] for s in data]
    items = [(a, b) for s, t in zip(data, scored) for a, b in zip(s['qa'], t['qa'])]
    assert items and all(list(b)[:len(a)] == list(a) and list(b)[len(a):] == ['sys_f1', 'memlab'] for a, b in items)
    assert all(b['sys_f1'] == round(b['sys_f1'], 3) and 0 <= b['sys_f1'] <= 1 and 'autoeval_label' not in b for _, b in items)
    cat5 = [b for a, b in items if a['category'] == 5]
    assert cat5 and all(b['sys_f1'] == (1 if b['sys_prediction'] == 'Not mentioned in the conversation' else 0) for b in cat5)
    same = [b for a, b in items if a['category'] in (2, 4) and b['sys_prediction'] == str(a.get('answer'))]
    assert same and all(b['sys_f1'] == 1.0 for b in same)


@pytest.mark.parametrize('args, message', [(['locomo', 'locomo10.json', '--out', 'x.json'], '--prediction-key'),
                                           (['longmemeval', 'longmemeval_s_cleaned.json', '--prediction-key', 'p'], 'kind locomo')])
def test_out_and_prediction_key_name_the_official_format(tmp_path, args, message):
    hyp = tmp_path / 'hyp.jsonl'; hyp.write_text(json.dumps({'question_id': 'x', 'hypothesis': 'y'}))
    kind, data, *rest = args
    r = memlab_main(['score-hypotheses', kind, FX / data, hyp, *[tmp_path / a if a.endswith('.json') else a for a in rest]])
    assert r['rc'] == 2 and message in r['err'], r['out']


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
