"""Statistics that refuse too few items (issue 22, item 5).

Below `memlab.stats.MIN_PAIRS_MCNEMAR` paired items a McNemar row keeps n, b, c and the accuracies and shows a note
instead of a p-value (Holm adjusts only the tests performed); below `MIN_N_CI` resampled units a CI is NaN with a note
while the estimate and n stay. The protocol tables inherit it (MemoryAgentBench's per-source CIs and long-context vs
RAG tests, MemGym's gains and Table 8's 1.96 SE), and MemGym's by-hop gains are per budget, never pooled.
"""
import numpy as np
import pandas as pd
import pytest

import memlab.stats as S
from memlab.stats import bootstrap_ci, bootstrap_table, holm, mcnemar_exact, mcnemar_table, paired_bootstrap_diff


def pairs(n: int, a_only: int=None) -> pd.DataFrame:
    "Two systems on n aligned questions: A right on all, B wrong on the first `a_only` (default: all)."
    a_only = n if a_only is None else a_only
    q = [f'q{i}' for i in range(n)]
    return pd.DataFrame(dict(system=['A'] * n + ['B'] * n, query_id=q * 2, correct=[1] * n + [0] * a_only + [1] * (n - a_only)))


def test_the_documented_defaults():
    assert (S.MIN_N_CI, S.MIN_PAIRS_MCNEMAR) == (10, 10)
    assert S.too_few(3, 10) == 'too few (n=3 < 10)' and S.too_few(10, 10) == ''


def test_mcnemar_below_the_minimum_shows_n_and_too_few_and_no_p():
    t = mcnemar_table(pairs(9), 'system', 'correct', 'query_id').iloc[0]
    assert (t.n, t.b, t.c, t.acc_a, t.acc_b) == (9, 9, 0, 1.0, 0.0)
    assert t.note == 'too few (n=9 < 10)'
    assert np.isnan(t.p) and np.isnan(t.p_holm) and not t.reject


def test_mcnemar_at_the_minimum_shows_the_p_value():
    t = mcnemar_table(pairs(10), 'system', 'correct', 'query_id').iloc[0]
    assert t.note == '' and t.p == pytest.approx(2 / 2 ** 10) and t.reject
    assert mcnemar_exact([1] * 10, [0] * 10).pvalue == pytest.approx(2 / 2 ** 10)


def test_the_minimum_counts_paired_items_not_discordant_pairs():
    t = mcnemar_table(pairs(12, a_only=2), 'system', 'correct', 'query_id').iloc[0]   # 12 pairs, 2 discordant
    assert (t.n, t.b + t.c, t.note) == (12, 2, '') and t.p == pytest.approx(0.5)


def test_holm_runs_only_over_the_tests_performed():
    d = pd.concat([pairs(3).assign(cell='small'), pairs(10).assign(cell='big1'), pairs(10, 8).assign(cell='big2')])
    t = mcnemar_table(d, 'system', 'correct', 'query_id', by='cell').set_index('cell')
    assert np.isnan(t.loc['small', 'p_holm'])
    done = t.loc[['big1', 'big2'], 'p'].to_numpy()
    assert t.loc[['big1', 'big2'], 'p_holm'].tolist() == pytest.approx(holm(done)[0].tolist())   # m = 2, not 3
    assert t.loc['big1', 'p_holm'] == pytest.approx(2 * 2 / 2 ** 10)


def test_min_n_parameter_and_module_setting():
    assert mcnemar_table(pairs(3), 'system', 'correct', 'query_id', min_n=3).iloc[0].note == ''
    old = S.MIN_PAIRS_MCNEMAR
    try:
        S.MIN_PAIRS_MCNEMAR = 20
        assert mcnemar_table(pairs(12), 'system', 'correct', 'query_id').iloc[0].note == 'too few (n=12 < 20)'
    finally: S.MIN_PAIRS_MCNEMAR = old


def test_ci_below_the_minimum_keeps_the_estimate_and_n():
    r = bootstrap_ci([1, 0, 1])
    assert (r.estimate, r.n, r.n_tasks, r.note) == (pytest.approx(2 / 3), 3, 3, 'too few (n=3 < 10)') and np.isnan([r.lo, r.hi]).all()
    d = paired_bootstrap_diff([1, 1, 0, 1], [0, 1, 0, 0])
    assert d.estimate == pytest.approx(0.5) and np.isnan(d.lo) and d.note == 'too few (n=4 < 10)'
    # the unit is the resampled task: 30 rollouts of 3 tasks are 3 items
    g = bootstrap_ci(np.r_[np.ones(15), np.zeros(15)], groups=np.repeat(['a', 'b', 'c'], 10))
    assert (g.n, g.n_tasks, g.note) == (30, 3, 'too few (n=3 < 10)')


def test_bootstrap_table_below_and_at_the_minimum():
    df = pd.DataFrame(dict(cell=['few'] * 9 + ['ten'] * 10, correct=[1, 0] * 4 + [1] + [1, 0] * 5))
    t = bootstrap_table(df, 'correct', by='cell').set_index('cell')
    assert t.loc['few', 'n'] == 9 and t.loc['few', 'note'] == 'too few (n=9 < 10)' and np.isnan(t.loc['few', ['lo', 'hi']].astype(float)).all()
    assert t.loc['few', 'mean'] == pytest.approx(5 / 9)
    assert t.loc['ten', 'note'] == '' and t.loc['ten', 'lo'] <= 0.5 <= t.loc['ten', 'hi']


def test_mab_lru_with_two_questions_prints_no_ci_and_no_test():
    from memlab.protocols.mab.report import per_source, lc_vs_best_rag
    rows = []
    for comp, task, n in (('LRU', 'infbench_sum', 2), ('AR', 'ruler_qa1', 12)):
        for agent, cat, right in (('long-context', 'Long-Context Agent', 1), ('bm25', 'Simple RAG Agent', 0)):
            rows += [dict(reader='r', agent=agent, category=cat, competency=comp, task=task, source=task, instance_id=f'{task}-0',
                          query_id=f'{task}-q{i}', sample=0, score=float(right), correct=float(right)) for i in range(n)]
    df = pd.DataFrame(rows)
    ps = per_source(df, n_resamples=100).set_index(['task', 'agent'])
    assert ps.loc[('infbench_sum', 'bm25'), 'note'] == 'too few (n=2 < 10)' and np.isnan(ps.loc[('infbench_sum', 'bm25'), 'lo'])
    assert ps.loc[('ruler_qa1', 'bm25'), 'note'] == ''
    mc = lc_vs_best_rag(df).set_index('competency')
    assert mc.loc['LRU', 'n'] == 2 and mc.loc['LRU', 'note'] == 'too few (n=2 < 10)' and np.isnan(mc.loc['LRU', 'p'])
    assert mc.loc['AR', 'note'] == '' and mc.loc['AR', 'p_holm'] == pytest.approx(mc.loc['AR', 'p'])   # Holm over one test


def test_memgym_gain_and_table8_refuse_small_cells():
    from memlab.protocols.memgym.paired import memory_gain, hop_table, table8
    ids = [f'i{k}' for k in range(5)]
    ep = pd.DataFrame(dict(track='dr', reasoner='r', strategy=['none'] * 5 + ['a-mem'] * 5, instance_id=ids * 2, hops=4,
                           score=[0.2, 0.4, 0.6, 0.1, 0.3, 0.9, 0.8, 0.7, 0.6, 0.5]))
    g = memory_gain(ep, n_resamples=100).iloc[0]
    assert (g.n_paired, g.note) == (5, 'too few (n=5 < 10)') and g.gain == pytest.approx(0.38)
    assert np.isnan([g.lo, g.hi, g.lo_full, g.p, g.p_holm]).all()
    h = hop_table(ep).set_index('strategy')
    assert h.loc['a-mem', 'n'] == 5 and np.isnan(h.loc['a-mem', ['se', 'half', 'lo', 'hi']].astype(float)).all()
    assert table8(hop_table(ep)).set_index('strategy').loc['a-mem', '4-hop (n=5)'] == '0.700 (too few: n=5)'


def test_memgym_gain_by_hop_is_per_budget_and_counts_each_instance_once():
    from memlab.protocols.memgym.paired import memory_gain, synth_episodes
    one = synth_episodes(n_dr=60, n_codeqa=0, seed=2)
    # the section generates the same DR candidates at every budget, their ids tagged with the budget
    ep = pd.concat([one.assign(budget=b, instance_id=one['instance_id'] + f'@{b // 1000}k') for b in (20_000, 50_000)], ignore_index=True)
    gh = memory_gain(ep, strata=('hop_stratum',), n_resamples=50)
    assert 'budget' in gh.columns
    assert gh.groupby(['budget', 'strategy', 'hop_stratum']).size().max() == 1
    assert len(gh) == 2 * (one['strategy'].nunique() - 1) * one.assign(h=np.minimum(one.hops, 5)).h.nunique()
    per = gh.groupby(['budget', 'strategy'])['n_paired'].sum()
    assert (per == 60).all()                                               # 60 instances per budget, never 120
    with pytest.raises(ValueError, match='pools 2 budgets'):
        memory_gain(ep, by=('track', 'reasoner'), strata=('hop_stratum',), n_resamples=50)
