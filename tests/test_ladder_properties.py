"Property tests of memlab.protocols.scale.ladder (seed 000 section 3): evidence-preserving, exact, nested, seeded, dated scale ladders."
import datetime as dt
import random
from functools import lru_cache

import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from memlab.core import Session, Turn, Instance
from memlab.protocols.scale.ladder import (DEFAULT_LADDER, ScaleLadder, SessionPool, build_query_ladder, ladder_history, ladder_conditions,
                           marked_relevant, fingerprint, parse_date, history_span, split_queries, table4, pool_from_instances)
from memlab.synth import make_ladder_benchmark, make_pool, make_benchmark, SLOTS, TALLIES, EVENTS

SETTINGS = dict(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@lru_cache(maxsize=None)
def bench(seed: int, n_queries: int = 10, pool_size: int = 80):
    "A small synthetic ladder benchmark (cached: hypothesis reuses it across examples)."
    return make_ladder_benchmark(n_queries=n_queries, pool_size=pool_size, seed=seed, session_turns=(1, 4))


@lru_cache(maxsize=None)
def hostile_pool(seed: int):
    """A pool mixing clean sessions with every kind of relevant session, undated sessions, and sessions dated after
    the questions: the ladder must exclude the former and redate the latter."""
    insts, clean = bench(seed)
    rng = random.Random(seed)
    extra = []
    for inst in insts:                                   # every query's evidence sits in the pool under its own id
        extra += inst.sessions
        s = rng.choice(inst.sessions)                    # ... and as a copy under another id, labels stripped
        extra.append(Session(id=f'dup_{inst.id}', date=s.date, turns=[Turn(role=t.role, content=t.content) for t in s.turns],
                             meta={'copy_of': s.id}))
    extra.append(Session(id='sim_labelled', date='2023/03/01 (Wed) 10:00',
                         turns=[Turn(role='user', content='I bought a bike.', meta={'has_answer': True})]))
    for i in range(15):                                  # undated, and dated after every question
        extra.append(Session(id=f'undated_{i}', turns=[Turn(role='user', content=f'undated chat {i}')]))
        extra.append(Session(id=f'future_{i}', date='2031/01/01 (Wed) 10:00', turns=[Turn(role='user', content=f'future chat {i}')]))
    return insts, list(clean) + extra


ladders = st.lists(st.integers(0, 60), min_size=1, max_size=5, unique=True).map(lambda xs: tuple(sorted(xs)))
seeds = st.integers(0, 2**32 - 1)
bench_seeds = st.integers(0, 3)


def ids(sessions): return [s.id for s in sessions]


def check_ladder(inst, pool, ladder, seed, relevant=marked_relevant):
    "Every property of one query's ladder; returns its histories."
    (q,) = inst.queries
    ql = build_query_ladder(inst, pool, ladder, seed)
    hs = ql.histories()
    ev_ids = set(q.evidence)
    ev_fps = {fingerprint(s) for s in inst.sessions if s.id in ev_ids}
    start, end = history_span(inst, q)
    prev, prev_dates = None, {}
    for name, n in ScaleLadder(ladder).scales.items():
        h = hs[name]
        got = ids(h)
        assert len(got) == len(set(got)), 'a session appears twice'
        assert ev_ids <= set(got), f'{name}: evidence lost'                                  # evidence preserved
        assert [s for s in h if s.id in ev_ids] == [s for s in inst.sessions if s.id in ev_ids]  # and unchanged
        irr = [s for s in h if s.id not in ev_ids]
        assert len(irr) == n, f'{name}: {len(irr)} irrelevant sessions, expected {n}'          # exact count
        for s in irr:                                                                        # nothing relevant
            assert not (relevant and relevant(s)) and fingerprint(s) not in ev_fps and s.id not in ev_ids, s.id
        dates = [parse_date(s.date) for s in h]
        assert dates == sorted(dates), f'{name}: not chronological'                           # chronological
        assert all(parse_date(s.date) <= end for s in irr) and all(s.date for s in h)        # before the question
        if prev is not None: assert prev <= set(got), f'{name}: not nested'                   # nested
        for s in h:                                                                          # same dates at every scale
            assert prev_dates.setdefault(s.id, s.date) == s.date
        prev = set(got)
    return hs


@settings(**SETTINGS)
@given(bench_seeds, ladders, seeds, st.data())
def test_clean_pool_properties(bseed, ladder, seed, data):
    insts, pool = bench(bseed)
    inst = data.draw(st.sampled_from(insts))
    check_ladder(inst, pool, ladder, seed)


@settings(**SETTINGS)
@given(bench_seeds, ladders, seeds, st.data())
def test_hostile_pool_excludes_relevant_and_redates(bseed, ladder, seed, data):
    insts, pool = hostile_pool(bseed)
    inst = data.draw(st.sampled_from(insts))
    hs = check_ladder(inst, pool, ladder, seed)
    (q,) = inst.queries
    start, end = history_span(inst, q)
    for s in hs[f's{len(ladder) - 1}']:
        if s.id.startswith(('undated_', 'future_')):             # redated into the query's span, original kept in meta
            assert start <= parse_date(s.date) <= end and 'original_date' in s.meta
        assert s.meta.get('copy_of') not in q.evidence and s.id != 'sim_labelled'


@settings(**SETTINGS)
@given(bench_seeds, ladders, seeds, st.data())
def test_determinism_and_pool_order_independence(bseed, ladder, seed, data):
    insts, pool = hostile_pool(bseed)
    inst = data.draw(st.sampled_from(insts))
    a = build_query_ladder(inst, pool, ladder, seed).histories()
    shuffled = list(pool); random.Random(seed).shuffle(shuffled)
    b = build_query_ladder(inst, SessionPool(shuffled), ScaleLadder(ladder), seed).histories()
    assert {k: [(s.id, s.date) for s in v] for k, v in a.items()} == {k: [(s.id, s.date) for s in v] for k, v in b.items()}


@settings(**SETTINGS)
@given(bench_seeds, st.integers(5, 60), seeds, st.data())
def test_different_seeds_draw_differently(bseed, n, seed, data):
    insts, pool = bench(bseed)                            # 80 eligible sessions: equal ordered draws of >= 5 are ~1e-9
    inst = data.draw(st.sampled_from(insts))
    a = build_query_ladder(inst, pool, (0, n), seed).irrelevant
    b = build_query_ladder(inst, pool, (0, n), seed + 1).irrelevant
    assert ids(a) != ids(b)


@settings(**SETTINGS)
@given(bench_seeds, ladders, st.integers(0, 60), seeds, st.data())
def test_draws_do_not_depend_on_other_rungs(bseed, ladder, extra, seed, data):
    "A query's prefix at N_irr is the same whatever the ladder's other rungs (one permutation per query)."
    insts, pool = hostile_pool(bseed)
    inst = data.draw(st.sampled_from(insts))
    big = tuple(sorted(set(ladder) | {ladder[-1] + extra + 1}))
    a, b = build_query_ladder(inst, pool, ladder, seed), build_query_ladder(inst, pool, big, seed)
    for n in ladder: assert [(s.id, s.date) for s in a.history(n)] == [(s.id, s.date) for s in b.history(n)]


@settings(**SETTINGS)
@given(bench_seeds, st.integers(1, 40), seeds, st.data())
def test_error_when_pool_too_small(bseed, short, seed, data):
    insts, pool = bench(bseed)
    inst = data.draw(st.sampled_from(insts))
    eligible = len(pool)                                  # the synthetic pool is all eligible
    with pytest.raises(ValueError) as e:
        build_query_ladder(inst, pool, (0, eligible + short), seed)
    msg = str(e.value)
    assert inst.queries[0].id in msg and f'only {eligible} eligible' in msg and str(eligible + short) in msg
    assert len(build_query_ladder(inst, pool, (0, eligible), seed).history(eligible)) == eligible + len(inst.sessions)


@settings(**SETTINGS)
@given(bench_seeds, seeds)
def test_runner_history_matches_query_ladder(bseed, seed):
    insts, pool = bench(bseed)
    hist = ladder_history(pool, (0, 10, 40), seed=seed)
    for inst in insts[:4]:
        ql = build_query_ladder(inst, pool, (0, 10, 40), seed)
        for c in ladder_conditions((0, 10, 40)):
            assert ids(hist(inst, c)) == ids(ql.history(c['scale'])) == ids(hist(inst, {'n_irr': c['n_irr']}))
    t = table4(insts, hist)
    n_ev = sum(len(i.sessions) for i in insts) / len(insts)
    assert t['sessions/query'].tolist() == pytest.approx([n_ev + n for n in (0, 10, 40)])


def own_statements():
    outs = [s.say.split('{v}')[0] for s in SLOTS] + [s.update.split('{v}')[0] for s in SLOTS if s.update]
    return outs + [t.say.split('{v}')[0] for t in TALLIES] + [f'Today I {e}' for e, _ in EVENTS]


@settings(max_examples=15, deadline=None, derandomize=True)
@given(seeds, st.integers(1, 8), st.floats(0, 1))
def test_synthetic_pool_is_irrelevant(seed, turns, rate):
    "Pool sessions never state a gold fact in the user's first person and carry no labels."
    pool = make_pool(60, seed=seed, session_turns=(1, turns), distractor_rate=rate)
    stm = own_statements()
    for s in pool:
        assert not marked_relevant(s)
        for t in s.turns: assert not any(x in t.content for x in stm), t.content


def test_split_queries_feeds_the_ladder():
    multi = make_benchmark(2, 4, 6, seed=1)
    single = split_queries(multi)
    assert len(single) == 8 and all(len(i.queries) == 1 for i in single)
    pool = [s for s in pool_from_instances(multi) if not marked_relevant(s)] + make_pool(50, seed=1)
    for inst in single:
        if inst.queries[0].evidence: check_ladder(inst, pool, (0, 5, 20), seed=3)
    with pytest.raises(ValueError, match='split_queries'):
        ladder_history(pool)(multi[0], {'scale': 's0'})


def test_default_ladder_is_the_papers():
    assert DEFAULT_LADDER == (0, 100, 200, 300, 400)
    assert ladder_conditions() == [{'scale': f's{k}', 'n_irr': 100 * k} for k in range(5)]


@settings(**SETTINGS)
@given(bench_seeds, ladders, seeds, st.data())
def test_exclusion_by_id_and_content_without_labels(bseed, ladder, seed, data):
    """With no relevance predicate, the ladder still excludes a pool session that has an evidence id (whatever its
    content) and one that has an evidence session's content (whatever its id)."""
    insts, clean = bench(bseed)
    inst = data.draw(st.sampled_from(insts))
    plain = [Session(id=f'{s.id}-x' if k % 2 else s.id, date=s.date,                 # same content, other id / same id, other content
                     turns=[Turn(role=t.role, content=t.content if k % 2 else t.content + ' (edited)') for t in s.turns])
             for i in insts for k, s in enumerate(i.sessions + i.sessions)]
    pool = SessionPool(list(clean) + plain, relevant=None)
    (q,) = inst.queries
    ev_fps = {fingerprint(s) for s in inst.sessions}
    ql = build_query_ladder(inst, pool, ladder, seed)
    for s in ql.irrelevant: assert s.id not in q.evidence and fingerprint(s) not in ev_fps
    check_ladder(inst, pool, ladder, seed, relevant=None)


@pytest.mark.parametrize('phrasing', ['a', 'b'])
def test_no_two_facts_of_one_user_share_a_value(phrasing):
    "Within one synthetic user (one history), the values of different facts (stated, updated, presupposed) never coincide."
    from memlab.synth import make_benchmark
    for inst in make_benchmark(8, 10, n_filler=2, seed=3, phrasing=phrasing):
        vals = [v for q in inst.queries if not q.abstention and q.qtype != 'temporal-reasoning'
                for v in (q.answers[0], q.meta.get('previous_answer'), q.meta.get('premise_value')) if v]
        assert len(vals) == len(set(vals)), (inst.id, vals)


def test_phrasing_b_pools_are_ten_times_the_draws():
    "Phrasing 'b' pools hold at least 10x what one user (one history, or one ladder query) draws from them."
    from memlab.synth import SLOTS_B, TALLIES_B
    assert all(len(set(s.pool)) >= 10 * 2 for s in SLOTS_B)      # a value and its update (or a false premise)
    assert all(len(set(t.pool)) >= 10 * 4 for t in TALLIES_B)    # up to four items per count question
