"""`score-hypotheses --out` for LoCoMo against what LoCoMo's own evaluate_qa.py writes (issue 23, item 6).

The fixture `fixtures/official/locomo_output.json` holds the output file snap-research/LoCoMo's `task_eval/evaluate_qa.py`
(3eb6f2c) wrote for 600 generated predictions, and the accuracies its `analyze_aggr_acc` printed (recorded by
`fixtures/official/record_locomo_output.py`, which runs the official script with stub modules). memlab scores the same
predictions with the `locomo` judge and must write the same file: `{sample_id, qa}` per sample, each QA item as given
with `<model>_f1` after it (memlab's own fields after that, under `memlab`), and aggregate to the same figures.
"""
import json
from pathlib import Path

import pytest

FX = Path(__file__).parent / 'fixtures' / 'official' / 'locomo_output.json'
if not FX.exists(): pytest.skip(f'{FX} is missing: run tests/fixtures/official/record_locomo_output.py', allow_module_level=True)
DATA = json.loads(FX.read_text())


@pytest.fixture(scope='module')
def scored(tmp_path_factory):
    from memlab.config import load_dataset
    from memlab.judge import make_judge
    from memlab.scoring import read_hypotheses, score_hypotheses
    tmp = tmp_path_factory.mktemp('locomo')
    inp, key = DATA['inputs'], DATA['prediction_key']
    (tmp / 'data.json').write_text(json.dumps([{**d, 'conversation': inp['conversation']} for d in inp['data']]))
    (tmp / 'pred.json').write_text(json.dumps(inp['predictions']))
    queries = {q.id: q for i in load_dataset({'kind': 'locomo', 'path': str(tmp / 'data.json')}) for q in i.queries}
    judge = make_judge('locomo')
    rows = score_hypotheses(read_hypotheses(tmp / 'pred.json', queries, key), queries, judge)
    return rows, judge


def test_output_file_matches_evaluate_qa(scored):
    from memlab.scoring import locomo_output_samples
    rows, judge = scored
    mine = locomo_output_samples(DATA['inputs']['predictions'], rows, DATA['prediction_key'], judge)
    off = DATA['outputs']['output_file']
    json.dumps(mine, allow_nan=False)                                         # strict JSON
    assert [list(s) for s in mine] == [list(s) for s in off] == [['sample_id', 'qa']] * len(off)
    pairs = [(a, b) for s, t in zip(mine, off) for a, b in zip(s['qa'], t['qa'])]
    assert len(pairs) == sum(len(s['qa']) for s in off) == 600
    diff = [(b['question'], {k: v for k, v in a.items() if k != 'memlab'}, b) for a, b in pairs
            if list(a)[:len(b)] != list(b) or {k: a[k] for k in b} != b or list(a)[len(b):] != ['memlab']]
    assert not diff, f'{len(diff)} of {len(pairs)} QA items differ from the official output file: {diff[:3]}'


def test_aggregation_matches_analyze_aggr_acc(scored):
    from memlab.judge import locomo_metrics
    rows, _ = scored
    m = locomo_metrics(rows).set_index('category')
    per = DATA['outputs']['per_category']
    for cat, (n, total, acc) in per.items():
        assert (m.loc[int(cat), 'n'], round(m.loc[int(cat), 'score'], 3)) == (n, acc), cat
    assert round(m.loc[0, 'score'], 3) == DATA['outputs']['overall']
