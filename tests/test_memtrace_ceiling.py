"""The offline reader's ceiling on the MemTrace generator (issue 22, MemTrace part of items 1, 2 and 6).

With exactly a probe's evidence sessions (`gold`) the strong tier answers every question type x KP group of both phrasing
sets; with no memory (`empty`) it answers none (boundary probes, whose right answer is an abstention, aside). The
phrasing sets ('a' and 'b' in `memlab.protocols.memtrace.data.SAYINGS` and the probe templates) are written independently:
a reader rule keyed on one set's wording would show as a gap between them.

Measured before the reader change (4 users x 20 sessions, strong tier, gold; a / b): trajectory 0.00 / 0.00 for static,
dynamic and preference KPs; preference current and historical 0.00 / 0.00; static current 1.00 / 0.00 ('Tell me my X.');
dynamic current 0.95 / 0.00; conflict current 0.60 / 0.41, historical 0.00 / 0.41. After: 1.00 in every cell of both sets.

The outside findings, each with a test below:
1. the trajectory template's 'changed over time' words were required evidence terms, so the strong tier abstained on
   facts that never changed: change cues now mark a change question and are not required (fixed);
2. weak-tier trajectory rose with age: those words were unmatched by the fact's own statement, and idf weights over what
   was read give an unseen term the most weight; older windows hold more sentences with 'time' or 'change' (fillers,
   other attributes' updates), which diluted them, so the statement passed the weak tier's answer floor more often as
   the history grew (static KPs, bm25, weak: 0.12 young -> 0.25 old windows before; >= 0.9 at every age now) (fixed);
3. strong-tier rows identical across bm25, entity-graph, items and ppr-graph: every one of these memories returns the
   probe's evidence sessions in its top-10 on the section's short histories (reach 1.0), and the reader's answer depends
   only on what it reads; a control with k=1 makes them differ (explained: faithful);
4. gold evidence lowered a strong-tier accuracy: the same dilution. With only the gold sessions an unmatched question
   word ('back' in 'Back on <day>, ...', 'time', 'tell') weighed the most and the strong tier fell under its answer
   floor, where production's filler sentences had diluted it (historical static, phrasing b, W7-W8: bm25 1.0, gold 0.0
   on the same probes). Cue words (change, as-of, requests) are no longer required terms; gold >= bm25 per cell (fixed);
5. conflict Gist 0-0.19: lower-case and quoted premises were not read as premises, 'How come' was not a why-question,
   and an interference probe's truth ('updated X from A to B') needs A, whose session was not among its evidence
   sessions (now: every session stating the KP's evidence, the replaced state included); the offline judge also
   counted 'your' as a correction token, so 'Your X is W' (the premise accepted) scored; it no longer does (fixed).
"""
import inspect, re

import pandas as pd
import pytest

from memlab import reader
from memlab.agent import run_loop
from memlab.ceiling import ceiling_rollouts
from memlab.memory import make_memory
from memlab.reader import TIERS, OfflineReader, believe, read_question, Sentence, rterms
from memlab.protocols.memtrace import data as mt
from memlab.protocols.memtrace.protocol import memtrace_dataset
from memlab.protocols.memtrace.scoring import MemTraceOfflineJudge
import memlab.planar, memlab.graph  # noqa: F401  (registers items, ppr-graph, entity-graph)

N = 20   # probes per (question type, KP group) cell at least
SIZE = dict(n_users=3, n_sessions=16, n_windows=4, seed=0)


def insts(phrasing): return memtrace_dataset(phrasing=phrasing, **SIZE)


@pytest.fixture(scope='module')
def cells():
    "Strong-tier accuracy per (phrasing, setting, qtype, kp_group), judged by the section's offline judge."
    out = []
    for ph in 'ab':
        ii = insts(ph)
        group = {q.id: q.meta['kp_group'] for i in ii for q in i.queries}
        df = ceiling_rollouts(ii, [{'name': 'offline-reader', 'tier': 'strong'}], judge={'name': 'memtrace-offline'})
        df = df.assign(kp_group=df['query_id'].map(group), qtype=df['qtype'].where(df['qtype'] != 'abstention', 'boundary'), phrasing=ph)
        out.append(df)
    df = pd.concat(out)
    return df.groupby(['phrasing', 'setting', 'qtype', 'kp_group'])['correct'].agg(['size', 'mean']).reset_index()


@pytest.mark.parametrize('phrasing', ['a', 'b'])
def test_strong_tier_gold_and_empty(cells, phrasing):
    t = cells[cells['phrasing'] == phrasing]
    assert (t['size'] >= N).all(), t[t['size'] < N]
    assert set(t['kp_group']) == set(mt.KP_GROUPS)
    gold = t[t['setting'] == 'gold'].set_index(['qtype', 'kp_group'])['mean']
    empty = t[(t['setting'] == 'empty') & (t['kp_group'] != 'boundary')].set_index(['qtype', 'kp_group'])['mean']
    assert len(gold) == 3 * 3 + 2 + 1 and (gold >= 0.95).all(), f'{phrasing}: gold below 0.95:\n{gold[gold < 0.95]}'
    assert (empty <= 0.05).all(), f'{phrasing}: empty above 0.05:\n{empty[empty > 0.05]}'


def test_phrasings_agree(cells):
    g = cells[cells['setting'] == 'gold'].pivot_table(index=['qtype', 'kp_group'], columns='phrasing', values='mean')
    assert ((g['a'] - g['b']).abs() <= 0.05).all(), g


def test_reader_has_no_memtrace_template_wording():
    "No four-word run of the MemTrace generator's statements or probe templates appears in the reader's source."
    kp = mt.KnowledgePoint(id='k', user='u', group='static', subject='Sarah Garcia', attribute='job title', value='nurse', first_session=0)
    pref = kp.model_copy(update=dict(group='preference', attribute='Foods I like to eat'))
    texts = [x for s in mt.SAYINGS.values() for x in s.values()]
    texts += [mt._texts(k, kind, 'May 1, 2025', person, ph) for k in (kp, pref) for kind in mt.QUESTION_KINDS
              for person in mt.PERSONS for ph in mt.PHRASINGS]
    texts += [mt._texts(kp.model_copy(update=dict(group='conflict', question='Q?')), 'historical', 'May 1, 2025', 'first', ph) for ph in mt.PHRASINGS]
    frags = set()
    for x in texts:
        for part in re.split(r'\{\w+\}|nurse|job title|Sarah Garcia|Foods I like to eat|May 1, 2025|Q\?', x):
            w = re.findall(r"[A-Za-z']+", part.lower())
            frags |= {' '.join(w[i:i + 4]) for i in range(len(w) - 3)}
    src = ' '.join(re.findall(r"[A-Za-z']+", inspect.getsource(reader).lower()))
    assert len(frags) > 20
    assert not sorted(f for f in frags if f in src), sorted(f for f in frags if f in src)


def mk(text, date): return Sentence(text, 'user', date, 0, frozenset(rterms(text)))


def test_finding_1_a_change_question_about_an_unchanged_fact():
    "Finding 1: 'changed over time' is a cue, not evidence: the strong tier answers an unchanged fact (it abstained)."
    S = [mk('For the record, curator is my job title.', '2025/03/01 (Sat) 10:00')]
    for q in ('How has my job title changed over time?', 'What values has my job title had, in order?', 'Has my job title ever changed?'):
        b = believe(read_question(q), S, TIERS['strong'])
        assert b.answer == 'It has not changed: curator.' and b.confidence >= TIERS['strong'].answer_min, (q, b)
    S += [mk('These days my job title is surveyor.', '2025/06/01 (Sun) 10:00')]
    assert believe(read_question('How has my job title changed over time?'), S, TIERS['strong']).answer == 'It changed from curator to surveyor.'


def _by_age(df):
    return df.assign(old=df['age'] >= df['age'].median()).groupby('old')['ok'].mean()


def _run(ii, memory, tier, keep, k=10):
    J, rows = MemTraceOfflineJudge(), []
    for inst in ii:
        mem = make_memory(memory, k=k); mem.add_all(inst.sessions)
        for q in inst.queries:
            if keep(q):
                a = run_loop(OfflineReader(tier), mem, q.view()).answer
                rows.append(dict(q=q.id, age=q.meta['age'], ok=bool(J('r', q, a).correct), a=a))
    return pd.DataFrame(rows)


def test_finding_2_weak_trajectory_does_not_rise_with_age():
    "Finding 2: on facts that never change the weak tier's trajectory accuracy is high at every age (it rose 0.08 -> 0.34 with age)."
    df = _run(insts('a'), 'bm25', 'weak', lambda q: q.qtype == 'trajectory' and q.meta['kp_group'] == 'static')
    assert len(df) >= N
    young, old = _by_age(df)[False], _by_age(df)[True]
    assert young >= 0.9 and old >= 0.9, (young, old)


def test_finding_3_identical_strong_rows_come_from_full_reach():
    "Finding 3 (faithful): the memories' strong-tier answers agree where every memory returns the evidence; a control with k=1 separates them."
    ii = insts('a')[:6]
    keep = lambda q: q.meta['kp_group'] in ('static', 'dynamic') and q.qtype == 'current'
    full = {m: _run(ii, m, 'strong', keep)['a'].tolist() for m in ('bm25', 'items', 'ppr-graph', 'entity-graph')}
    assert len({tuple(v) for v in full.values()}) == 1          # identical: each memory's top-10 holds the evidence
    low = {m: _run(ii, m, 'strong', keep, k=1)['a'].tolist() for m in ('bm25', 'items', 'ppr-graph', 'entity-graph')}
    assert len({tuple(v) for v in low.values()}) > 1            # control: when retrieval misses, the memories differ


def test_finding_4_gold_evidence_does_not_lower_strong_accuracy():
    "Finding 4: per question type x KP group, the strong tier with the gold sessions is at least as accurate as with bm25 top-10."
    for ph in 'ab':   # the latest windows: the longest histories, where production reads the most filler
        ii = [i for i in memtrace_dataset(n_users=3, n_sessions=20, phrasing=ph, seed=0) if i.meta['window'] in ('W7', 'W8')]
        J, rows = MemTraceOfflineJudge(), []
        for inst in ii:
            bm = make_memory('bm25', k=10); bm.add_all(inst.sessions)
            for q in inst.queries:
                gold = make_memory('long-context', window_tokens=10 ** 9); gold.add_all([s for s in inst.sessions if s.id in q.evidence])
                for name, mem in (('bm25', bm), ('gold', gold)):
                    a = run_loop(OfflineReader('strong'), mem, q.view()).answer
                    rows.append(dict(mem=name, cell=(q.qtype, q.meta['kp_group']), ok=bool(J('r', q, a).correct)))
        t = pd.DataFrame(rows).pivot_table(index='cell', columns='mem', values='ok')
        assert (t['gold'] >= t['bm25']).all(), (ph, t[t['gold'] < t['bm25']])


def test_finding_5_conflict_probes_are_answered_from_memory():
    "Conflict Gist was 0-0.19 for every system: the strong tier now rejects a false premise naming what it remembers, with bm25 top-10 too."
    for ph in 'ab':
        df = _run(memtrace_dataset(n_users=3, n_sessions=20, phrasing=ph, seed=0), 'bm25', 'strong', lambda q: q.meta['kp_group'] == 'conflict')
        assert len(df) >= N and df['ok'].mean() >= 0.9, (ph, df['ok'].mean(), df[~df['ok']].head())
        assert df['a'].str.contains('does not match what I remember').mean() >= 0.9


def test_accepting_a_false_premise_is_no_gist():
    "The offline judge's correction tokens leave out pronouns: 'Your job title is nurse' (the premise accepted) shares only 'your' with the correction."
    from memlab.core import Query
    q = Query(id='q', question='Why is my job title nurse?', answers=['Your job title is curator, not nurse.'], qtype='current',
              meta=dict(condition='conflict', canonical='Your job title is curator, not nurse.'))
    J = MemTraceOfflineJudge()
    assert not J('r', q, 'Your job title is nurse because you changed careers.').correct
    assert J('r', q, 'That premise does not match what I remember: it was curator, not nurse.').correct


@pytest.mark.parametrize('phrasing', ['a', 'b'])
def test_third_person_questions(phrasing):
    "HaluMem asks about the user by name ('Sarah Garcia's job title'): a name that nothing read mentions is the memory's own user."
    ii = memtrace_dataset(person='third', phrasing=phrasing, **{**SIZE, 'n_users': 2})
    df = ceiling_rollouts(ii, [{'name': 'offline-reader', 'tier': 'strong'}], judge={'name': 'memtrace-offline'})
    acc = df[df['qtype'] != 'abstention'].groupby(['setting', 'qtype'])['correct'].mean()
    assert (acc['gold'] >= 0.95).all() and (acc['empty'] <= 0.05).all(), acc
