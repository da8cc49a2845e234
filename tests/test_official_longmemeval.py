"""memlab's LongMemEval scoring against the official code's outputs (issue 23, items 3, 5 and 6).

The fixture `fixtures/official/longmemeval.json` holds what xiaowu0162/LongMemEval's own `evaluate_qa.py` and
`print_qa_metrics.py` output on seeded scenarios (recorded by `fixtures/official/record_longmemeval.py`, which runs
the official scripts with a stub judge client). Here memlab judges the same hypotheses with the same judge replies
and must give the same labels, summaries, aggregation and eval-results lines. Each test counts the differing
inputs and names that count when it fails.
"""
import json, math
from pathlib import Path

import pandas as pd
import pytest

from memlab.core import Query
from memlab.judge import make_judge, judge_many, scores_frame, aggregate_runs, judge_summary, longmemeval_metrics, LME_PRINT_ORDER

FX = Path(__file__).parent / 'fixtures' / 'official' / 'longmemeval.json'
if not FX.exists(): pytest.skip(f'{FX} is missing: run tests/fixtures/official/record_longmemeval.py', allow_module_level=True)
DATA = json.loads(FX.read_text())
MODEL = 'gpt-4o-2024-08-06'      # evaluate_qa.py's model_zoo['gpt-4o']; print_qa_metrics.py asserts it


def replay(replies: dict):
    "A judge `complete` answering each prompt with the reply the recorder gave the official script for that question."
    def complete(messages):
        q = messages[0]['content'].split('\n\nQuestion: ', 1)[1].split('\n\n', 1)[0]
        return replies[q]
    return complete


def judged(k: int):
    "Scenario k judged by memlab: (queries, pairs, scores frame, score_hypotheses rows, judge)."
    from memlab.scoring import score_hypotheses
    inp = DATA['inputs'][k]
    queries = {r['question_id']: Query(id=r['question_id'], question=r['question'], answers=[str(r['answer'])], qtype=r['question_type'],
                                       abstention='_abs' in r['question_id']) for r in inp['ref']}
    pairs = [(h['question_id'], h['hypothesis']) for h in inp['hyp']]
    judge = make_judge('longmemeval', complete=replay(inp['replies']), model=MODEL)
    scores = scores_frame(judge_many(judge, [(q, queries[q], a) for q, a in pairs]))
    return queries, pairs, scores, score_hypotheses(pairs, queries, judge), judge


SCEN = range(len(DATA['inputs']))
JUDGED = {}
def get(k):
    if k not in JUDGED: JUDGED[k] = judged(k)
    return JUDGED[k]


def same(a, b, tol=5.1e-5):
    "Official figures are printed with round(x, 4); NaN is recorded as None."
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
        return (a is None or (isinstance(a, float) and math.isnan(a))) and (b is None or (isinstance(b, float) and math.isnan(b)))
    return abs(a - b) <= tol


def test_fixture_is_the_official_record():
    assert DATA['source'] == 'xiaowu0162/LongMemEval' and len(DATA['commit']) == 40
    n = sum(len(i['hyp']) for i in DATA['inputs'])
    assert n >= 1000, n
    replies = {r for i in DATA['inputs'] for r in i['replies'].values()}
    assert {'N', 'Y', 'Correct', ''} <= replies                       # the cases
    settings = {s for o in DATA['outputs'] for s in o['call_settings']}
    assert settings == {json.dumps({'max_tokens': 10, 'model': MODEL, 'n': 1, 'temperature': 0}, sort_keys=True)}
    j = get(0)[4]
    assert j.params == {'temperature': 0.0, 'max_tokens': 10} and j.model == MODEL


def test_labels_match_evaluate_qa():
    "autoeval_label: 'yes' in the reply; a reply without yes or no ('N', 'Y', 'Correct', '') is False."
    diff = total = 0
    for k in SCEN:
        rows = get(k)[3].set_index('query_id')
        for line in DATA['outputs'][k]['eval_results']:
            total += 1
            diff += rows.loc[line['question_id'], 'autoeval_label'] != line['autoeval_label'] | {'model': MODEL}
    assert diff == 0, f'{diff} of {total} labels differ from evaluate_qa.py'


def test_judge_summary_counts_as_evaluate_qa():
    "judge_summary of the official judge: evaluate_qa.py's printed Accuracy (unparsed = wrong); memlab's parsed-only figure named apart."
    diff, total, shown = 0, 0, []
    for k in SCEN:
        s = judge_summary(get(k)[2]).iloc[0]
        off = DATA['outputs'][k]['evaluate_qa']['accuracy']
        total += 1
        if not same(s['accuracy'], off): diff += 1; shown.append((k, round(s['accuracy'], 4), off))
    assert diff == 0, f'{diff} of {total} scenarios: judge_summary accuracy differs from evaluate_qa.py: {shown[:5]}'
    for k in SCEN:                                                  # per answer too: `correct` of one run is the official label
        agg = aggregate_runs(get(k)[2])
        assert same(agg['correct'].mean(), DATA['outputs'][k]['evaluate_qa']['accuracy']), k
    s = judge_summary(get(1)[2]).iloc[0]          # the 500-answer run with 5% unparsed replies
    assert s['n_unparsed'] > 0 and s['accuracy_parsed_only'] > s['accuracy']


def test_longmemeval_metrics_match_print_qa_metrics():
    "Per type, task-averaged, overall and abstention accuracy; an absent type and then the task average are nan, as printed."
    diff, total, shown = 0, 0, []
    for k in SCEN:
        queries, _, _, rows, _ = get(k)
        m = longmemeval_metrics(rows).set_index('metric')
        pm = DATA['outputs'][k]['print_qa_metrics']
        want = {t: v for t, v in pm['per_type'].items()} | {'task-averaged': [pm['task_averaged'], None], 'overall': [pm['overall'], None],
                                                          'abstention': pm['abstention']}
        for name, (acc, n) in want.items():
            total += 1
            ok = name in m.index and same(m.loc[name, 'accuracy'], acc) and (n is None or m.loc[name, 'n'] == n)
            if not ok: diff += 1; shown.append((k, name, m.loc[name, 'accuracy'] if name in m.index else 'missing', acc))
    assert diff == 0, f'{diff} of {total} figures differ from print_qa_metrics.py: {shown[:5]}'


def test_absent_type_is_named():
    m = longmemeval_metrics(get(2)[3]).set_index('metric')          # scenario 2: no temporal-reasoning question
    assert math.isnan(m.loc['temporal-reasoning', 'accuracy']) and math.isnan(m.loc['task-averaged', 'accuracy'])
    assert 'temporal-reasoning' in m.loc['task-averaged', 'note'] and m.loc['temporal-reasoning', 'n'] == 0
    assert list(m.index[:6]) == list(LME_PRINT_ORDER)


def test_eval_results_lines_match_evaluate_qa():
    "score-hypotheses --out: each hypothesis record as given, in input order, then autoeval_label; memlab's fields after; strict JSON."
    from memlab.scoring import official_eval_records
    diff = total = 0
    for k in SCEN:
        _, _, _, rows, judge = get(k)
        mine = official_eval_records(DATA['inputs'][k]['hyp'], rows, judge)
        off = DATA['outputs'][k]['eval_results']
        total += len(off)
        assert len(mine) == len(off)
        for a, b in zip(mine, off):
            json.dumps(a, allow_nan=False)                                   # strict JSON
            keys = list(a)
            diff += keys[:len(b)] != list(b) or {x: a[x] for x in b} != b or set(keys[len(b):]) != {'memlab'}
    assert diff == 0, f'{diff} of {total} eval-results lines differ from evaluate_qa.py'
