"""Issue 22, MemoryAgentBench part of items 1-3: the offline reader's ceiling per synthetic family, and what decides
the offline numbers (memory or reader).

Gold evidence is the whole context in one unit (`memlab.protocols.mab.agents.whole_context`: MemoryAgentBench's
questions carry no evidence labels; the paper's long-context agent reads the whole context), run through
`memlab.ceiling` (`mab_reader_ceiling`: the runner's `readback` on a window that keeps everything; `empty`: the `none`
memory), scored by the section's `mab-metric` judge. At the section's size (4000-token contexts, 8 questions per
context), three seeds, so n >= 20 per family (LongMemEval: per question type, twenty seeds).

The five ICL sets are measured at the full run's 32K-token contexts (`ICL_TOKENS`): a balanced set of 4000 tokens
holds 1-3 examples per label (banking77 has 77 labels, clinic150 151), where the released rows hold 77 (banking77,
5900 shots) and 47 (clinic150, 7050 shots) per label, and 32K tokens hold 15-24. At 4000 tokens the few-shot regime is
measured by `test_icl_few_shot_regime`, whose phrasing 'b' gaps stay strict xfails (`KNOWN_GAPS`).

Targets (strong tier): gold >= 0.95 and empty <= 0.05 per family; EventQA is a choice among six options, so an empty
memory scores chance (1/6), not 0; ∞Bench-Sum (F1 against key points) and Recom (Recall@5) are not pass/fail: their
mean score with gold must exceed the empty score by the margin measured (∞Bench-Sum gold 0.65, Recom 1.00; empty
0.00). Known gaps are strict xfails with their reason.

Second phrasing sets (issue 22: "every generator gets a second phrasing set ... the strong tier's gold-evidence
accuracy per type differs by at most 0.05 between the two sets"): FactConsolidation, RULER-QA (per family) and
LongMemEval (per question type, `phrasing='b'` of `make_longmemeval_s_star`), EventQA (the event sentences; its question
is the official template), the five ICL sets (other frames, openers, tails and TREC frames; the same labels and entity
pools), Recom (other dialogue sentences, ReDial's Seeker/Recommender roles; the same catalogue) and ∞Bench-Sum (EventQA's
phrasing 'b' for story events and key points). Recom and ∞Bench-Sum are continuous metrics: on phrasing 'b' their
gold - empty score must reach the margin in CONTINUOUS, and their gold score differ from phrasing 'a''s by <= 0.05.

LongMemEval's single-session-preference is left out of the gold target, as abstention types are elsewhere (issue 22:
"abstention types aside"): its gold is a rubric the official judge reads with its own template ("a rubric for desired
personalized response ... The model does not need to reflect all the points in the rubric"), not an answer read back
from memory. The section's offline judge (offline-match) can only find a gold's words in the answer, so an answer that
uses the stated preference is WRONG unless it copies the rubric's wording, and the only reader that scores is one that
writes the generator's rubric template (`test_offline_judge_cannot_score_a_rubric`). Like an abstention question, it
has no span in memory to read; unlike one, it needs a model judge. Its no-memory floor is still checked.
"""
import pytest

from memlab.core import Evidence
from memlab.judge import make_judge, LME_TEMPLATES
from memlab.memory import make_memory
from memlab.reader import ABSTAIN
from memlab.protocols.mab.agents import mab_synthetic, mab_reader_ceiling, whole_context, memorize_history, MABJudge
from memlab.protocols.mab.protocol import retrieval_query
from memlab.protocols.mab.reader import read_task, numbered_facts, labelled_examples, fact_pool, answer_facts, MAB_SKILLS
from memlab.protocols.mab.synth import MAB_GENERATORS, LME_PREFERENCES

FAMILIES = sorted(f for f in MAB_GENERATORS if f != 'longmemeval_s*')
PHRASED = ('eventqa', 'factconsolidation_sh', 'factconsolidation_mh', 'ruler_qa1', 'ruler_qa2', 'icl_banking77',
           'icl_clinic150', 'icl_nlu', 'icl_trec_coarse', 'icl_trec_fine')   # families with a phrasing 'b' (issue 22, item 5)
PHRASED_CONTINUOUS = ('infbench_sum', 'recsys_redial')                        # phrasing 'b', scored by `CONTINUOUS`
CONTINUOUS = {'infbench_sum': 0.40, 'recsys_redial': 0.80}   # gold score - empty score, at least (measured: 0.65, 1.00)
CHANCE = {'eventqa': 1 / 6}                                    # a choice among six options: no memory answers at chance
LME_TYPES = ('knowledge-update', 'multi-session', 'single-session-assistant', 'single-session-preference',
             'single-session-user', 'temporal-reasoning')
RUBRIC_TYPES = {'single-session-preference': "judged against a rubric by LongMemEval's preference template; the offline "
                                               "judge matches words, not a rubric (module docstring)"}
ICL_FAMILIES = ('icl_banking77', 'icl_clinic150', 'icl_nlu', 'icl_trec_coarse', 'icl_trec_fine')
ICL_TOKENS = 32768            # the ICL sets' context size here: the full run's (module docstring)
_ICL_B_GAP = ("few-shot regime (4000 tokens: 1-3 examples per label): ICL phrasing 'b' frames carry more content words "
              "(tails 'without visiting a branch', frames 'could someone explain why I cannot'); with so few examples the "
              "profile reader cannot tell a label's key (verb and object, in every example of the label) from a frame "
              "(in one example of each of many labels), and matches a label that shares the frame and one key word over "
              "the label that shares both key words in another frame. At 32K tokens (15-24 examples per label) both "
              "phrasings score 1.00. Measured gold at 4000 tokens (3 seeds; 10 seeds: 0.85 / 0.85, n=80): ")
KNOWN_GAPS = {   # closed in issue 22: icl_trec_fine, knowledge-update, ruler_qa1/b, ruler_qa2/b
    'icl_banking77/b@4000': _ICL_B_GAP + 'banking77 a 1.00, b 0.83 (n=24).',
    'icl_clinic150/b@4000': _ICL_B_GAP + 'clinic150 a 1.00, b 0.88 (n=24).'}


def gaps(names):
    "Parameters, known gaps marked as strict xfails with their reason."
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[n])) if n in KNOWN_GAPS else n for n in names]


def family_instances(fam, seeds=range(3), tokens=None, **kw):
    "Three contexts (seeds) of 8 questions; 4000 tokens, the ICL sets `ICL_TOKENS` unless `tokens` is given."
    if fam == 'infbench_sum': return mab_synthetic({fam: dict(n_contexts=12, questions_per_context=1, seed=0, **kw)}, params=dict(context_tokens=4000))
    tokens = tokens or (ICL_TOKENS if fam in ICL_FAMILIES else 4000)
    return [i.model_copy(update={'id': f's{s}:{i.id}'}) for s in seeds
            for i in mab_synthetic({fam: kw}, params=dict(n_contexts=1, questions_per_context=8, context_tokens=tokens, seed=s))]


def per_setting(t):
    "n, accuracy and mean score per setting (gold, empty) of a `mab_reader_ceiling` frame, summed over its rows."
    g = t.groupby('setting').apply(lambda d: dict(n=int(d['n'].sum()), accuracy=(d['accuracy'] * d['n']).sum() / d['n'].sum(),
                                                  score=(d['score'] * d['n']).sum() / d['n'].sum()))
    return {s: g[s] for s in ('gold', 'empty')}


@pytest.fixture(scope='module')
def table():
    "Per family (LongMemEval: per question type): n, gold/empty accuracy and mean score, strong tier."
    out = {}
    for fam in FAMILIES: out[fam] = per_setting(mab_reader_ceiling(family_instances(fam), ('strong',)))
    t = mab_reader_ceiling(family_instances('longmemeval_s*', range(20)), ('strong',))
    for r in t.itertuples(): out.setdefault(r.qtype, {})[r.setting] = dict(n=r.n, accuracy=r.accuracy, score=r.score)
    return out


@pytest.fixture(scope='module')
def table_b():
    "Phrasing set 'b' of the families that have one: gold and empty accuracy and score, strong tier."
    return {fam: per_setting(mab_reader_ceiling(family_instances(fam, phrasing='b'), ('strong',))) for fam in PHRASED + PHRASED_CONTINUOUS}


@pytest.fixture(scope='module')
def table_lme_b():
    "LongMemEval phrasing 'b', per question type: gold and empty accuracy, strong tier."
    t = mab_reader_ceiling(family_instances('longmemeval_s*', range(20), phrasing='b'), ('strong',))
    return {(r.qtype, r.setting): dict(n=r.n, accuracy=r.accuracy) for r in t.itertuples()}


@pytest.mark.parametrize('qtype', [t for t in LME_TYPES if t not in RUBRIC_TYPES])
def test_second_phrasing_set_longmemeval(table, table_lme_b, qtype):
    "The same check per LongMemEval question type (twenty seeds)."
    g, e = table_lme_b[qtype, 'gold'], table_lme_b[qtype, 'empty']
    assert g['n'] >= 20 and g['accuracy'] >= 0.95 and e['accuracy'] <= 0.05, (g, e)
    assert abs(g['accuracy'] - table[qtype]['gold']['accuracy']) <= 0.05, (g, table[qtype])


@pytest.mark.parametrize('fam', PHRASED)
def test_second_phrasing_set(table, table_b, fam):
    "Issue 22: the reader must not read the generator's wording; an independently worded set scores the same (<= 0.05)."
    b = table_b[fam]
    floor = CHANCE.get(fam, 0.0) + 0.05 + (0.10 if fam in CHANCE else 0)              # as `test_no_memory_floor`
    assert b['gold']['n'] >= 20 and b['gold']['accuracy'] >= 0.95 and b['empty']['accuracy'] <= floor, b
    assert abs(b['gold']['accuracy'] - table[fam]['gold']['accuracy']) <= 0.05, (b, table[fam])


@pytest.mark.parametrize('case', gaps([f'{f}/{p}@4000' for f in ICL_FAMILIES for p in 'ab']))
def test_icl_few_shot_regime(case):
    "The ICL sets at 4000 tokens, 1-3 examples per label: the ceiling on both phrasings (two known gaps on 'b')."
    fam, p = case.split('@')[0].split('/')
    r = per_setting(mab_reader_ceiling(family_instances(fam, tokens=4000, phrasing=p), ('strong',)))
    assert r['gold']['n'] >= 20 and r['empty']['accuracy'] <= 0.05, r
    assert r['gold']['accuracy'] >= 0.95, r


@pytest.mark.parametrize('fam', PHRASED_CONTINUOUS)
def test_second_phrasing_set_continuous(table, table_b, fam):
    "Recom and ∞Bench-Sum: on phrasing 'b' gold beats empty by the margin, and the gold score moves <= 0.05."
    g, e = table_b[fam]['gold'], table_b[fam]['empty']
    assert g['n'] >= (12 if fam == 'infbench_sum' else 20) and e['score'] <= 0.05 and g['score'] - e['score'] >= CONTINUOUS[fam], (g, e)
    assert abs(g['score'] - table[fam]['gold']['score']) <= 0.05, (g, table[fam])


@pytest.mark.parametrize('fam', FAMILIES)
def test_enough_questions(table, fam):
    assert table[fam]['gold']['n'] >= (12 if fam == 'infbench_sum' else 20), table[fam]


@pytest.mark.parametrize('fam', gaps([f for f in FAMILIES if f not in CONTINUOUS]))
def test_gold_ceiling(table, fam):
    assert table[fam]['gold']['accuracy'] >= 0.95, table[fam]


@pytest.mark.parametrize('fam', [f for f in FAMILIES if f not in CONTINUOUS])
def test_no_memory_floor(table, fam):
    assert table[fam]['empty']['accuracy'] <= CHANCE.get(fam, 0.0) + 0.05 + (0.10 if fam in CHANCE else 0), table[fam]


@pytest.mark.parametrize('fam', sorted(CONTINUOUS))
def test_continuous_metrics_gold_above_empty(table, fam):
    g, e = table[fam]['gold']['score'], table[fam]['empty']['score']
    assert e <= 0.05 and g - e >= CONTINUOUS[fam], (g, e)


@pytest.mark.parametrize('qtype', LME_TYPES)
def test_longmemeval_no_memory(table, qtype):
    assert table[qtype]['empty']['accuracy'] <= 0.05, table[qtype]


@pytest.mark.parametrize('qtype', LME_TYPES)
def test_longmemeval_enough_questions(table, qtype):
    assert table[qtype]['gold']['n'] >= 20, table[qtype]


@pytest.mark.parametrize('qtype', gaps([t for t in LME_TYPES if t not in RUBRIC_TYPES]))
def test_longmemeval_gold_ceiling(table, qtype):
    assert table[qtype]['gold']['accuracy'] >= 0.95, table[qtype]


def test_offline_judge_cannot_score_a_rubric():
    "Why preference questions are out of the offline target: LongMemEval judges them by a rubric, offline-match by words."
    assert set(RUBRIC_TYPES) <= set(LME_TEMPLATES) and all('Rubric' in LME_TEMPLATES[t] for t in RUBRIC_TYPES)
    qs = [q for i in family_instances('longmemeval_s*', range(20)) for q in i.queries if q.qtype in RUBRIC_TYPES]
    assert len(qs) >= 20
    j, n = MABJudge(catalogue='synthetic'), 0
    for q in qs:
        (rubric,) = q.answers
        (v,) = [v for _, ask, tmpl, vals in LME_PREFERENCES.values() if ask == q.question for v in vals if tmpl.format(v=v) == rubric]
        assert j._verdict(q, rubric)[0] == 'CORRECT'                              # the rubric's own words pass
        # a response that satisfies the rubric (it uses the preference the user stated) but not in its words fails
        n += j._verdict(q, f'You told me you love {v}, so go with {v}: you will enjoy it.')[0] == 'WRONG'
    assert n == len(qs), n


def test_gold_is_the_whole_context():
    insts = family_instances('factconsolidation_sh', [0])
    (w,) = whole_context(insts)
    assert len(insts[0].sessions) > 1 and len(w.sessions) == 1
    assert w.sessions[0].turns[0].content == ' '.join(s.turns[0].content for s in insts[0].sessions)
    assert all(q.evidence == [w.sessions[0].id] for q in w.queries) and all(not q.evidence for q in insts[0].queries)


# issue 22: "All four strong-tier non-items agents score an identical 61.92 on InfBench-Sum"

def _f1(q, units, judge=MABJudge(catalogue='synthetic')): return judge._verdict(q, read_task(q.view(), units, 'strong'))[1]


def test_summary_depends_on_what_memory_returned():
    "Half the book (its first half, as a FIFO window that lost the rest would hold) scores lower than all of it (measured: 0.40 vs 0.61)."
    half, whole = [], []
    for b in mab_synthetic({'infbench_sum': {}}, params=dict(n_contexts=3, context_tokens=32768, seed=0)):
        q, chunks = b.queries[0], [Evidence(text=s.turns[0].content, session_id=s.id, rank=r) for r, s in enumerate(b.sessions)]
        half.append(_f1(q, chunks[:len(chunks) // 2])); whole.append(_f1(q, chunks))
        assert _f1(q, []) == 0.0
    assert sum(half) / 3 < sum(whole) / 3 - 0.1, (half, whole)


def test_identical_summary_scores_come_from_identical_units():
    "The mechanism: when k chunks cover the book, every top-k agent returns all of it (32K-token books, 4096-token chunks)."
    (b,) = mab_synthetic({'infbench_sum': {}}, params=dict(n_contexts=1, context_tokens=32768, seed=0))
    q = b.queries[0]
    assert len(b.sessions) <= 10
    lc = make_memory('long-context', window_tokens=10**8); lc.add_all(b.sessions)
    for name in ('bm25', 'dense', 'ppr-graph'):
        m = make_memory(name, k=10); m.add_all(b.sessions)
        got = m.search(retrieval_query(q.task, q.question))
        assert {u.session_id for u in got} == {s.id for s in b.sessions}, name
        assert abs(_f1(q, got) - _f1(q, lc.search(q.question))) < 1e-9, name


# issue 22: "items score 0 on FactConsolidation and MCC because the reader needs 'n. fact' serial numbers"

def _items(inst):
    m = make_memory('items', k=10)
    for s in memorize_history(inst, {}): m.add(s)
    return m


def test_factconsolidation_read_without_serials():
    "Fails before issue 22: the reader answered nothing from unnumbered facts."
    undated = [Evidence(text='user: The capital of Atlantis is Poseidonis.', session_id='a', rank=0),
               Evidence(text='user: The capital of Atlantis is Kallipolis.', session_id='b', rank=1)]
    S = MAB_SKILLS['strong']
    assert answer_facts('What is the capital of Atlantis?', fact_pool(undated, 'strong'), S) == 'Poseidonis'   # order unknown: first read
    dated = [u.model_copy(update={'date': d}) for u, d in zip(undated, ['2024/01/01 (Mon) 10:00', '2024/03/01 (Fri) 10:00'])]
    assert answer_facts('What is the capital of Atlantis?', fact_pool(dated, 'strong'), S) == 'Kallipolis'     # later date: newer
    (fc,) = family_instances('factconsolidation_sh', [0])[:1]
    m = _items(fc)
    answers = [read_task(q.view(), m.search(retrieval_query(q.task, q.question)), 'strong') for q in fc.queries]
    assert sum(a != ABSTAIN for a in answers) >= 6, answers


def test_items_keep_facts_but_not_serials():
    (fc,) = family_instances('factconsolidation_sh', [0])[:1]
    texts = [it['text'].removeprefix('user: ') for it in _items(fc).items]
    facts = numbered_facts([s.turns[0].content for s in fc.sessions])
    assert numbered_facts(texts) == [] and sum(f.text in texts for f in facts) >= 0.95 * len(facts)


def test_items_cut_every_mcc_example_from_its_label():
    "MCC's 0 for items is the memory's loss: no stored item pairs an example with its own label."
    (mcc,) = family_instances('icl_banking77', [0])[:1]
    pairs = set(labelled_examples([s.turns[0].content for s in mcc.sessions]))
    kept = labelled_examples([it['text'].removeprefix('user: ') for it in _items(mcc).items])
    assert len(pairs) > 50 and not [p for p in kept if p in pairs]
