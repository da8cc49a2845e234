"""Issue 22, items 1-2: the SubtleMemory offline reader's ceiling, verified per subtype on both phrasing sets.

With gold evidence (the oracle transcript of the target sessions) the strong relation tier must answer >= 0.95 of every
subtype, with no memory (nothing read) <= 0.05, and the two independently written phrasing sets must agree within 0.05:
otherwise the reader reads the generator's wording rather than memory. n >= 20 per subtype and phrasing set.
"""
import pandas as pd
import pytest
from memlab.agent import run_loop
from memlab.core import QueryView
from memlab.memory import make_memory
from memlab.runner import EvidenceView
from memlab.protocols.subtle.protocol import subtlememory_dataset
from memlab.protocols.subtle.answer import SubtleReader, oracle_setting
from memlab.protocols.subtle.judge import SubtleOfflineJudge

KNOWN_GAPS = {}     # (subtype, phrasing) -> why it misses the ceiling; none left (the last: a verb shared with one of two
                    # conflicting statements read as a context anchor, closed by `slot_terms`)


def ceiling(phrasing: str, tier: str='strong') -> pd.DataFrame:
    insts, judge, pol = subtlememory_dataset(n_personas=4, n_unrelated=8, n_sets=2, phrasing=phrasing), SubtleOfflineJudge(), SubtleReader(tier)
    rows = []
    for inst in insts:
        for q in inst.queries:
            gold = oracle_setting(make_memory('none'), q, inst, inst.sessions)
            for setting, mem in (('gold', gold), ('empty', EvidenceView(make_memory('none')))):
                a = run_loop(pol, mem, QueryView(question=q.question)).answer
                rows.append(dict(qtype=q.meta['relation_subtype'], setting=setting, correct=judge.judge('r', q, a).correct))
    return pd.DataFrame(rows).groupby(['qtype', 'setting'])['correct'].agg(['mean', 'size']).unstack('setting')


@pytest.fixture(scope='module')
def tables(): return {p: ceiling(p) for p in ('a', 'b')}


@pytest.mark.parametrize('phrasing', ['a', 'b'])
def test_enough_items_per_subtype(tables, phrasing):
    assert (tables[phrasing][('size', 'gold')] >= 20).all(), tables[phrasing]


@pytest.mark.parametrize('phrasing', ['a', 'b'])
def test_no_memory_answers_nothing(tables, phrasing):
    assert (tables[phrasing][('mean', 'empty')] <= 0.05).all(), tables[phrasing]


@pytest.mark.parametrize('phrasing,qtype', [(p, t) for p in 'ab' for t in ('K>1', 'K=1', 'any_one', 'Temporal', 'Context', 'contradictory')])
def test_gold_evidence_ceiling(tables, phrasing, qtype):
    if (qtype, phrasing) in KNOWN_GAPS: pytest.xfail(KNOWN_GAPS[qtype, phrasing])
    assert tables[phrasing].loc[qtype, ('mean', 'gold')] >= 0.95, tables[phrasing]


@pytest.mark.parametrize('qtype', ['K>1', 'K=1', 'any_one', 'Temporal', 'Context', 'contradictory'])
def test_phrasing_sets_agree(tables, qtype):
    if any((qtype, p) in KNOWN_GAPS for p in 'ab'): pytest.xfail('; '.join(KNOWN_GAPS[qtype, p] for p in 'ab' if (qtype, p) in KNOWN_GAPS))
    a, b = (tables[p].loc[qtype, ('mean', 'gold')] for p in 'ab')
    assert abs(a - b) <= 0.05, (a, b)
