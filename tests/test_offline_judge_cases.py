"""The offline judges against a hand-labelled set of hard cases (`tests/data/offline_judge_cases.jsonl`).

Each case is labelled by the rules of the official judge prompt the offline judge stands in for (LongMemEval's
per-type prompts and seed 000's A.3 for `offline-match`; SubtleMemory's grading rules and relation guidance for
`subtlememory-offline`); where a prompt is silent, a reply listing several candidates for a single-valued gold is
WRONG. The `rule` field of each case names the sentence that decides it. Labels are never edited to match a verdict.
The 268 cases with ids `om-*` / `sm-*` were written and labelled before the judges' strict rules (the lenient judges
agreed on 0.731 of them); the 44 with ids `omh-*` / `smh-*` were written after the rules, as a held-out check, and
labelled before they were run.
"""
import json
from collections import Counter
from pathlib import Path

import pytest
from memlab.core import Query
from memlab.judge import make_judge
import memlab.protocols.subtle.judge  # noqa: F401  (registers subtlememory-offline)

CASES = Path(__file__).parent / 'data' / 'offline_judge_cases.jsonl'
JUDGE_NAMES = ('offline-match', 'subtlememory-offline')
KINDS = {'offline-match': {'exact', 'paraphrase', 'hedge', 'enumeration', 'unclear', 'partial', 'date-format',
                           'number-format', 'abstention', 'premise'},
         'subtlememory-offline': {'exact', 'paraphrase', 'hedge', 'enumeration', 'unclear', 'partial', 'date-format',
                                  'number-format', 'condition'}}
QUERY_FIELDS = ('qtype', 'abstention')   # qmeta keys that are Query fields; the rest is Query.meta


def load_cases() -> list[dict]:
    return [json.loads(l) for l in CASES.read_text(encoding='utf-8').splitlines() if l.strip()]


def to_query(case: dict) -> Query:
    "The Query the judge sees: the golds as answers, qmeta split into Query fields and meta."
    m = dict(case['qmeta'])
    fields = {k: m.pop(k) for k in QUERY_FIELDS if k in m}
    return Query(id=case['id'], question=case['question'], answers=case['golds'], meta=m, **fields)


def verdicts(cases: list[dict]) -> list[str]:
    judges = {n: make_judge(n) for n in JUDGE_NAMES}
    return [judges[c['judge']].judge(c['id'], to_query(c), c['answer']).label for c in cases]


def agreement(cases, got) -> dict:
    "Agreement per judge and overall, and the disagreements."
    out, bad = {}, [(c, v) for c, v in zip(cases, got) if v != c['label']]
    for n in JUDGE_NAMES:
        idx = [i for i, c in enumerate(cases) if c['judge'] == n]
        out[n] = sum(got[i] == cases[i]['label'] for i in idx) / len(idx)
    out['overall'] = sum(v == c['label'] for c, v in zip(cases, got)) / len(cases)
    return out, bad


def test_the_set_is_large_labelled_and_covers_every_kind():
    cases = load_cases()
    assert len(cases) >= 200
    assert len({c['id'] for c in cases}) == len(cases)
    assert {c['label'] for c in cases} == {'CORRECT', 'WRONG'}
    for n in JUDGE_NAMES:
        mine = [c for c in cases if c['judge'] == n]
        assert KINDS[n] <= {c['kind'] for c in mine}, (n, KINDS[n] - {c['kind'] for c in mine})
        labels = Counter(c['label'] for c in mine)
        assert min(labels.values()) >= 0.3 * len(mine), labels      # easy positives too: strictness is not free
    assert all(c['rule'].strip() and c['golds'] for c in cases)


def test_agreement_with_the_labels():
    cases = load_cases()
    got = verdicts(cases)
    acc, bad = agreement(cases, got)
    print('\nagreement: ' + ', '.join(f'{k} {v:.3f}' for k, v in acc.items()) + f'  (n={len(cases)})')
    for c, v in bad:
        print(f"  {c['id']}: answer={c['answer']!r} gold={c['golds']!r} label={c['label']} verdict={v}")
    assert acc['overall'] >= 0.98, acc
    for n in JUDGE_NAMES: assert acc[n] >= 0.95, (n, acc)
