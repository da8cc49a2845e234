"""MemGym's offline numbers decided by memory: the reasoner's ceiling (gold notes / no notes), the None control, the two
phrasing sets, value pools, and why masking and the sliding window equal None under the evicted protocol."""
import json, random, re
import pandas as pd
import pytest
from memlab.memory import terms
from memlab.protocols.memgym import dr as DR, codeqa as CQ
from memlab.protocols.memgym.protocol import (memgym_ceiling, ceiling_items, dr_candidates, dr_instances, MemGymAnswer,
                                              MemGymOfflineJudge, ManagedContext, _ask)
from memlab.protocols.memgym.paired import memory_gain
from memlab.protocols.memgym.strategies import PAPER_PLACEHOLDER

HOPS = [3, 4, 5, 6]


@pytest.fixture(scope='module')
def dr_ceiling():
    return pd.concat([memgym_ceiling(n_dr=20, hops=HOPS, tracks=('dr',), phrasing=ph) for ph in ('a', 'b')], ignore_index=True)


@pytest.fixture(scope='module')
def codeqa_ceiling():
    return pd.concat([memgym_ceiling(n_codeqa=12, tracks=('codeqa',), phrasing=ph) for ph in ('a', 'b')], ignore_index=True)


def _acc(t, ph, setting):
    return t[(t.phrasing == ph) & (t.setting == setting)].set_index('qtype')['accuracy']


# ---- 1. the reasoner's ceiling ----

def test_ceiling_columns_and_sizes(dr_ceiling, codeqa_ceiling):
    for t in (dr_ceiling, codeqa_ceiling):
        assert {'qtype', 'tier', 'setting', 'n', 'accuracy'} <= set(t.columns) and set(t['tier']) == {'offline'}
        assert t['n'].min() >= 20 and t['n_unjudged'].sum() == 0
    assert sorted(set(dr_ceiling.qtype)) == ['3-hop', '4-hop', '5/6-hop']
    assert sorted(set(codeqa_ceiling.qtype)) == ['multi-fact', 'single-fact']


@pytest.mark.parametrize('ph', ['a', 'b'])
def test_dr_gold_and_empty(dr_ceiling, ph):
    assert _acc(dr_ceiling, ph, 'gold').min() >= 0.95 and _acc(dr_ceiling, ph, 'empty').max() <= 0.05


def test_codeqa_gold_and_empty_phrasing_a(codeqa_ceiling):
    assert _acc(codeqa_ceiling, 'a', 'gold').min() >= 0.95 and _acc(codeqa_ceiling, 'a', 'empty').max() <= 0.05


def test_empty_is_empty_for_both_phrasings(codeqa_ceiling):
    assert _acc(codeqa_ceiling, 'b', 'empty').max() <= 0.05


# ---- 3. two phrasing sets ----

def test_dr_phrasings_agree(dr_ceiling):
    assert (_acc(dr_ceiling, 'a', 'gold') - _acc(dr_ceiling, 'b', 'gold')).abs().max() <= 0.05


def test_codeqa_phrasings_agree(codeqa_ceiling):
    # before the reasoner weighed only the question terms its evidence uses, phrasing b's gold accuracy was 0.50 / 0.53
    assert _acc(codeqa_ceiling, 'b', 'gold').min() >= 0.95
    assert (_acc(codeqa_ceiling, 'a', 'gold') - _acc(codeqa_ceiling, 'b', 'gold')).abs().max() <= 0.05


def test_phrasings_are_written_independently():
    a, b = DR.synth_dr(8, budget_tokens=0, seed=11), DR.synth_dr(8, budget_tokens=0, seed=11, phrasing='b')
    for x, y in zip(a, b):
        assert [t.sub_answer for t in x.turns] == [t.sub_answer for t in y.turns] and x.answer == y.answer
        assert x.question != y.question
        assert not {f.content for f in x.grounding_facts} & {f.content for f in y.grounding_facts}
        assert not {d.text for t in x.turns for d in t.documents} & {d.text for t in y.turns for d in t.documents}
    for n in DR.RELATIONS:                                          # no relation's sentence or phrase is the other set's
        ra, rb = DR.RELATIONS[n], DR.RELATIONS_B[n]
        assert ra.fact != rb.fact and ra.phrase != rb.phrase and ra.query != rb.query
    ca, cb = CQ.synth_codeqa(3, seed=4), CQ.synth_codeqa(3, seed=4, phrasing='b')
    for x, y in zip(ca, cb):
        assert [q.qa_id for q in x.qa_pairs] == [q.qa_id for q in y.qa_pairs]
        assert not {q.question for q in x.qa_pairs} & {q.question for q in y.qa_pairs if q.linked_fact_ids != ['F7']}
        fa, fb = {f.id: f.content for f in x.grounding_facts}, {f.id: f.content for f in y.grounding_facts}
        assert all(fa[k] != fb[k] for k in ('F1', 'F2', 'F3', 'F4', 'F5', 'F6'))
        ta, tb = {f.id: f.topic for f in x.grounding_facts}, {f.id: f.topic for f in y.grounding_facts}
        assert all(ta[k] != tb[k] for k in ta) and x.task_prompt != y.task_prompt
        # the record's own lines (its three documents without facts and distractors) are b's too; filler documents (other
        # teams' files) are shared
        stated = lambda i: [f.content for f in i.grounding_facts] + [d.content for d in i.distractors]
        own = lambda i: {l for t in list(i.memory_files.values())[:3] for l in t.split('\n') if l.strip() and not any(c in l for c in stated(i))}
        assert own(x) and own(y) and not own(x) & own(y)
        assert not {d.content for d in x.distractors if d.source == 'same_function'} & {d.content for d in y.distractors if d.source == 'same_function'}


def test_reasoner_reads_words_not_templates():
    R = DR.OfflineDRReasoner()
    # a third wording, in neither generator: the vocabulary still reads it
    assert R.answer('Who is the creator of Quorvane Institute?', '- Ilsa Brenn is the creator of Quorvane Institute.', '')[0] == 'Ilsa Brenn'
    assert R.answer('Name the mayor of Tarnavel.', 'Tarnavel elected Oren Kask as mayor.', '')[0] == 'Oren Kask'
    # a question (a search header) states no fact; another relation's sentence is not this one's
    assert R.answer('Who set up Quorvane Institute?', 'Who set up Quorvane Institute?', '')[0] == DR.INSUFFICIENT
    assert R.answer('What is the founding year of Tarnavel?', 'Tarnavel was founded by Oren Kask.', '')[0] == DR.INSUFFICIENT


def test_value_pools_and_distinct_values():
    # DR: name cores, given names, years and numbers: pools at least 10x the draws of one instance
    insts = DR.synth_dr(40, budget_tokens=0, seed=8)
    draws = max(len({d.title for t in x.turns for d in t.documents} | {t.sub_answer for t in x.turns}) for x in insts)
    assert len(DR._ONSETS) * len(DR._MIDS) * len(DR._CODAS) >= 10 * draws
    years = max(len(set(re.findall(r'\b1[6-9]\d\d\b|\b20[01]\d\b', ' '.join(d.text for t in x.turns for d in t.documents)))) for x in insts)
    assert 0 < years and (2019 - 1650 + 1) >= 10 * years and (98_000 - 120) >= 10 * draws
    for x in insts:                                                 # no two facts of one instance share a value
        objs = [x.grounding_facts[0].source_paragraph_title] + [t.sub_answer for t in x.turns]
        assert len(set(objs)) == len(objs)
        names = {d.title for t in x.turns for d in t.documents if d.is_supporting}
        assert len(names) == x.num_hops
    # CodeQA: every kind's value pool has at least 10 values (one draw per instance); the people of one instance differ
    assert min(len(k['values']) for k in CQ._KINDS.values()) >= 10
    for i in range(40):
        s = CQ._story(0, i)
        people = [s[k] for k in ('dev', 'reporter', 'reviewer', 'reviewer2', 'skeptic')]
        assert len(set(people)) == len(people)
        assert len({s['customer'].split()[0], s['partner'], s['partner2'], s['plugin'], s['site']}) == 5
        assert s['value'] != s['n_fail'] or s['kind'] == 'quota'   # the protocol asks: the quota fails at its own value


# ---- 2. the None control ----

def _episode(inst, strategy: dict):
    m = ManagedContext(strategy=strategy, trigger_size=4, trigger_tokens=10**9, autoscale=False)
    for s in inst.sessions: m.add(s)
    return m


@pytest.fixture(scope='module')
def dr_episodes():
    # no adversarial contradictions: the full context then answers (what the control test without eviction needs)
    raw = [d for j, h in enumerate(HOPS) for d in DR.synth_dr(3, hops=(h,), budget_tokens=5000, seed=j, start=100 * j, contradicted=0)]
    insts = dr_instances(raw, 5000)
    specs = {'none': {'name': 'none'}, 'llm-summarizing': {'name': 'llm-summarizing', 'max_size': 4, 'max_tokens': None},
             'sliding-window': {'name': 'sliding-window', 'max_size': 4, 'max_tokens': None},
             'observation-masking': {'name': 'observation-masking', 'max_size': 4, 'max_tokens': None, 'attention_window': 1}}
    return raw, insts, {n: [_episode(i, sp) for i in insts] for n, sp in specs.items()}


def _score(inst, notes, visible, pol=MemGymAnswer(), judge=MemGymOfflineJudge()):
    q = inst.queries[0]
    return judge._score(q, _ask(pol, q.view(), notes, visible))


def _gain(scores: dict) -> pd.DataFrame:
    ep = pd.DataFrame([dict(track='dr', strategy=s, reasoner='offline', instance_id=f'i{k}', score=v)
                       for s, vs in scores.items() for k, v in enumerate(vs)])
    return memory_gain(ep, by=('track', 'reasoner'), n_resamples=200, min_n=1).set_index('strategy')


def test_gain_vanishes_with_none_notes_and_reaches_the_ceiling_with_gold(dr_episodes):
    raw, insts, eps = dr_episodes
    none = [_score(i, m.notes(), m.visible) for i, m in zip(insts, eps['none'])]
    own = [_score(i, m.notes(), m.visible) for i, m in zip(insts, eps['llm-summarizing'])]
    swapped = [_score(i, n.notes(), m.visible) for i, m, n in zip(insts, eps['llm-summarizing'], eps['none'])]
    gold = [_score(i, DR.all_memory_notes(d), m.visible) for i, d, m in zip(insts, raw, eps['llm-summarizing'])]
    g = _gain({'none': none, 'own': own, 'swapped': swapped, 'gold': gold})
    assert max(none) == 0.0                                         # the None control: nothing to follow the chain with
    assert g.loc['own', 'gain'] > 0                                 # the strategy's own notes carry bridge facts
    assert g.loc['swapped', 'gain'] == 0 and g.loc['swapped', 'b'] == g.loc['swapped', 'c'] == 0
    assert g.loc['gold', 'gain'] == 1.0 == g.loc['gold', 'score_mem']   # at the ceiling (gold accuracy 1.0 offline)


def test_masking_and_window_equal_none_under_eviction(dr_episodes):
    raw, insts, eps = dr_episodes
    for name in ('sliding-window', 'observation-masking'):
        for i, d, m, n in zip(insts, raw, eps[name], eps['none']):
            kept = [x['content'] for x in m.filtered]
            # the mechanism: they keep only raw observations (or masks of them), which the evicted protocol removes
            assert all(c in m.raw or c in m.task or PAPER_PLACEHOLDER in c for c in kept), name
            assert not any(f.content in m.notes() for f in d.grounding_facts)
            assert _score(i, m.notes(), m.visible) == _score(i, n.notes(), n.visible) == 0.0
        assert any(len(m.filtered) < len(n.filtered) or any(PAPER_PLACEHOLDER in x['content'] for x in m.filtered)
                   for m, n in zip(eps[name], eps['none']))        # they did act on the episodes


def test_masking_and_window_differ_from_none_without_eviction(dr_episodes):
    raw, insts, eps = dr_episodes
    R = DR.OfflineDRReasoner()
    def unevicted(i, m):                                           # eviction off: the answer reads the strategy's context
        a, _ = R.answer(i.queries[0].question, '', '\n'.join(x['content'] for x in m.filtered))
        return DR.offline_answer_score(i.queries[0].answers[0], a)
    none = [unevicted(i, m) for i, m in zip(insts, eps['none'])]
    assert sum(none) > 0
    for name in ('sliding-window', 'observation-masking'):
        assert sum(unevicted(i, m) for i, m in zip(insts, eps[name])) < sum(none), name


def _question_share(insts) -> float:
    "Mean share of a question's terms that its linked facts use."
    xs = []
    for x in insts:
        fm = {f.id: f.content for f in x.grounding_facts}
        for q in x.qa_pairs:
            qt = set(terms(q.question))
            xs.append(len(qt & set(terms(' '.join(fm[k] for k in q.linked_fact_ids)))) / len(qt))
    return sum(xs) / len(xs)


def test_codeqa_questions_are_written_from_their_own_sets_facts():
    # the cause of the old gap: b's questions shared 0.59 of their terms with b's facts (a's: 0.77), the function name and
    # little else, so with the whole record the code lines naming the function outranked the fact (28 of 83 pairs broken)
    share = {ph: _question_share(CQ.synth_codeqa(12, seed=0, phrasing=ph)) for ph in ('a', 'b')}
    assert min(share.values()) >= 0.7 and abs(share['a'] - share['b']) <= 0.1, share


@pytest.mark.parametrize('seed', [0, 1])
def test_codeqa_verifier_solvability_agrees_between_phrasings(seed):
    # was a strict xfail: 28 of 83 b pairs broken against 0 of 83 (seed 0) before b's record was written as one set
    counts = {ph: CQ.verify_all(CQ.synth_codeqa(12, seed=seed, phrasing=ph), CQ.OfflineCodeQAReasoner())[1] for ph in ('a', 'b')}
    share = lambda ph, v: counts[ph]['verdicts'][v] / counts[ph]['pairs_checked']
    assert abs(share('a', 'broken') - share('b', 'broken')) <= 0.05
    assert abs(share('a', 'valid') - share('b', 'valid')) <= 0.1 and min(share(ph, 'valid') for ph in 'ab') >= 0.7
