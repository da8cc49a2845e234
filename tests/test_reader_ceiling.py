"""The offline reader's ceiling on memlab's own generators: with exactly the evidence (gold) the strong tier answers every
question type of both generators, in both phrasing sets; with no memory (empty) it answers none (abstention aside).

The two phrasing sets ('a' and 'b' in `memlab.synth`) are written independently of each other: a reader rule that keyed on
one set's wording would show up here as a gap between the two. Tiers differ only by their `Tier` settings.
"""
import inspect, re

import pandas as pd
import pytest

from memlab import reader, synth
from memlab.ceiling import reader_ceiling
from memlab.reader import TIERS, OfflineReader
from memlab.synth import make_benchmark, make_ladder_benchmark
from template_runs import word_runs

N = 20   # questions per type at least


def bench(gen, phrasing):
    if gen == 'history': return make_benchmark(10, 10, n_filler=3, seed=7, phrasing=phrasing)   # 2 per type per history
    return make_ladder_benchmark(100, pool_size=5, seed=7, phrasing=phrasing)[0]               # 20 per type


@pytest.fixture(scope='module')
def ceilings():
    return {(g, p): reader_ceiling(bench(g, p), [{'name': 'offline-reader', 'tier': 'strong'}])
            for g in ('history', 'ladder') for p in ('a', 'b')}


@pytest.mark.parametrize('gen', ['history', 'ladder'])
@pytest.mark.parametrize('phrasing', ['a', 'b'])
def test_strong_tier_ceiling(ceilings, gen, phrasing):
    t = ceilings[gen, phrasing]
    assert (t['n'] >= N).all(), t
    assert set(t['qtype']) == ({'single-session-user', 'knowledge-update', 'temporal-reasoning', 'abstention'} |
                               ({'false-premise'} if gen == 'history' else {'multi-session'}))
    gold = t[t['setting'] == 'gold'].set_index('qtype')['accuracy']
    empty = t[(t['setting'] == 'empty') & (t['qtype'] != 'abstention')].set_index('qtype')['accuracy']
    assert (gold >= 0.95).all(), f'{gen}/{phrasing}: gold below 0.95:\n{gold}'
    assert (empty <= 0.05).all(), f'{gen}/{phrasing}: empty above 0.05:\n{empty}'


@pytest.mark.parametrize('gen', ['history', 'ladder'])
def test_phrasings_agree(ceilings, gen):
    a, b = ([ceilings[gen, p].query("setting == 'gold'").set_index('qtype')['accuracy'] for p in 'ab'])
    gap = (a - b).abs()
    assert set(a.index) == set(b.index) and (gap <= 0.05).all(), f'{gen}: phrasing a vs b gold accuracy:\n{pd.DataFrame(dict(a=a, b=b))}'


def test_phrasing_b_is_another_text():
    "Set 'b' shares no statement or question with set 'a' (same facts, other words)."
    for gen in ('history', 'ladder'):
        qa, qb = [{q.question for i in bench(gen, p) for q in i.queries} for p in 'ab']
        assert not qa & qb
        ta, tb = [{t.content for i in bench(gen, p) for s in i.sessions for t in s.turns if t.meta.get('has_answer')} for p in 'ab']
        assert not ta & tb


def _template_fragments():
    "Every four-word run of fixed text in the generators' statement and question templates (both phrasings)."
    texts = [x for s in synth.SLOTS + synth.SLOTS_B for x in (s.say, s.ask, s.update, s.ask_update, s.distract, s.premise, s.abstain) if x]
    texts += [x for t in synth.TALLIES + synth.TALLIES_B for x in (t.say, t.ask, t.distract, t.pair, *t.forms) if x]
    texts += [x for e in synth.EVENTS + synth.EVENTS_B for x in e] + ['Today I', 'When did I', 'On what date did I', 'What was the date when I']
    return word_runs(texts)


def test_reader_has_no_template_wording():
    "No four-word run of a generator's template appears in the reader's source (a rule keyed on wording would)."
    src = ' '.join(re.findall(r"[A-Za-z']+", inspect.getsource(reader).lower()))
    frags = _template_fragments()
    assert len(frags) > 100
    hits = sorted(f for f in frags if f in src)
    assert not hits, hits


def test_tiers_differ_only_by_tier_settings():
    "A reader built as 'weak' but given the strong tier's settings answers exactly as the strong reader: nothing else depends on the name."
    qs = [q for i in bench('ladder', 'b')[:30] for q in i.queries]
    from memlab.memory import make_memory
    from memlab.agent import run_loop
    answers = {}
    for name, tier in (('strong', None), ('swapped', TIERS['strong']), ('weak', None)):
        pol = OfflineReader(name if tier is None else 'weak')
        if tier is not None: pol.tier = tier
        out = []
        for inst in bench('ladder', 'b')[:30]:
            mem = make_memory('bm25', k=12); mem.add_all(inst.sessions)
            out += [run_loop(pol, mem, q.view()).answer for q in inst.queries]
        answers[name] = out
    assert answers['strong'] == answers['swapped'] and answers['weak'] != answers['strong']
    for f in ('believe', 'candidate', 'count_belief', 'read_question', 'relative_day'):
        assert not re.search(r"'(weak|medium|strong)'", inspect.getsource(getattr(reader, f))), f
    assert not re.search(r"tier\.name|\.tier\.name", inspect.getsource(reader.OfflineReader.act))
