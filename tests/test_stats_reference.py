"""memlab.stats against reference implementations (scipy, statsmodels) and explicit loops, on the same inputs.

Exact statistics (McNemar, Holm, κ, ρ) must agree to 1e-12. Bootstrap intervals use a different RNG stream from
scipy's, so they are compared within a tolerance set from the Monte Carlo error (a few times its standard deviation,
far below the interval half-width); resample-by-resample agreement is checked exactly against `resample_counts`.
"""
import numpy as np
import pandas as pd
import pytest
from scipy import stats as ss
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.inter_rater import cohens_kappa as sm_kappa
from statsmodels.stats.multitest import multipletests

from memlab.stats import (bootstrap_ci, paired_bootstrap_diff, bootstrap_table, mcnemar_exact, holm, mcnemar_table,
                          cohens_kappa, kappa_ci, spearman, spearman_ci, coverage_simulation, resample_counts, task_index)

SEEDS = [0, 1, 2, 3, 4]


# --- bootstrap intervals -------------------------------------------------------------------------------------------

def _scipy_ci(data, statistic, seed, B, paired=False):
    r = ss.bootstrap(data, statistic, method='percentile', n_resamples=B, rng=seed, vectorized=True, paired=paired,
                     batch=1000)
    return r.confidence_interval.low, r.confidence_interval.high


@pytest.mark.parametrize('seed', SEEDS)
def test_bootstrap_ci_bernoulli_vs_scipy(seed):
    rng = np.random.default_rng(100 + seed)
    x = (rng.random(2000) < rng.uniform(0.2, 0.8)).astype(float)
    r = bootstrap_ci(x, n_resamples=10_000, seed=seed)
    lo, hi = _scipy_ci((x,), np.mean, seed, 10_000)
    assert r.estimate == x.mean()
    # Monte Carlo sd of each endpoint ~0.0003 here; a wrong resampling scheme moves them by > 0.005
    assert abs(r.lo - lo) < 0.003 and abs(r.hi - hi) < 0.003, (r, lo, hi)


@pytest.mark.parametrize('seed', SEEDS)
def test_bootstrap_ci_float_vs_scipy(seed):
    rng = np.random.default_rng(200 + seed)
    x = rng.gamma(2.0, 1.0, size=500)
    r = bootstrap_ci(x, n_resamples=10_000, seed=seed)
    lo, hi = _scipy_ci((x,), np.mean, seed, 10_000)
    se = x.std(ddof=1) / np.sqrt(len(x))
    assert r.estimate == x.mean()
    assert abs(r.lo - lo) < 0.1 * se and abs(r.hi - hi) < 0.1 * se, (r, lo, hi, se)


@pytest.mark.parametrize('seed', SEEDS)
def test_paired_diff_vs_scipy(seed):
    rng = np.random.default_rng(300 + seed)
    a = (rng.random(2000) < 0.6).astype(float)
    b = np.where(rng.random(2000) < 0.8, a, 1 - a)
    r = paired_bootstrap_diff(a, b, n_resamples=10_000, seed=seed)
    lo, hi = _scipy_ci((a, b), lambda u, v, axis: u.mean(axis) - v.mean(axis), seed, 10_000, paired=True)
    assert r.estimate == pytest.approx(a.mean() - b.mean(), abs=1e-15)
    assert abs(r.lo - lo) < 0.003 and abs(r.hi - hi) < 0.003, (r, lo, hi)


def test_bootstrap_ci_same_draws_as_scipy():
    """Stronger than the tolerance tests: scipy 1.17 (pinned) draws `default_rng(seed).integers(0, n, (B, n))`, the same
    stream as `bootstrap_ci(seed=seed)`, so the percentile endpoints coincide. If a scipy upgrade changes its draws,
    this test may fail without a bug in memlab; the tolerance tests above remain the contract."""
    for seed in SEEDS:
        rng = np.random.default_rng(500 + seed)
        x, z = (rng.random(1000) < 0.4).astype(float), rng.normal(size=1000)
        for v in (x, z):
            r = bootstrap_ci(v, n_resamples=2000, seed=seed)
            lo, hi = _scipy_ci((v,), np.mean, seed, 2000)
            assert abs(r.lo - lo) < 1e-12 and abs(r.hi - hi) < 1e-12
        r = paired_bootstrap_diff(x, (z > 0).astype(float), n_resamples=2000, seed=seed)
        lo, hi = _scipy_ci((x, (z > 0).astype(float)), lambda u, v, axis: u.mean(axis) - v.mean(axis), seed, 2000, paired=True)
        assert abs(r.lo - lo) < 1e-12 and abs(r.hi - hi) < 1e-12


def _clustered(seed, T=300, strata=False):
    rng = np.random.default_rng(400 + seed)
    sizes = rng.integers(1, 8, size=T)                      # uneven rollouts per task
    q = rng.beta(1.0, 1.0, size=T)
    g = np.repeat([f't{i:04d}' for i in range(T)], sizes)
    y = (rng.random(len(g)) < np.repeat(q, sizes)).astype(float)
    s = np.repeat(np.where(q > 0.5, 'hi', 'lo'), sizes) if strata else None
    return y, g, s


def _loop_cluster_ci(y, g, s, B, seed):
    "Reference: explicit loop over resamples, drawing task ids (within strata) and concatenating their rollouts."
    rng = np.random.default_rng(seed)
    tasks = pd.unique(g)
    by_task = {t: y[g == t] for t in tasks}
    strata = {t: (s[g == t][0] if s is not None else 0) for t in tasks}
    pools = {h: [t for t in tasks if strata[t] == h] for h in set(strata.values())}
    est = []
    for _ in range(B):
        drawn = [t for pool in pools.values() for t in rng.choice(pool, size=len(pool), replace=True)]
        est.append(np.concatenate([by_task[t] for t in drawn]).mean())
    return np.quantile(est, [0.025, 0.975])


@pytest.mark.parametrize('seed', SEEDS[:3])
@pytest.mark.parametrize('strat', [False, True])
def test_cluster_bootstrap_vs_loop(seed, strat):
    y, g, s = _clustered(seed, strata=strat)
    r = bootstrap_ci(y, g, n_resamples=4000, seed=seed, strata=s)
    lo, hi = _loop_cluster_ci(y, g, s, 4000, seed + 1000)
    assert r.estimate == y.mean()
    # measured |diff| <= 0.0023; resampling rollouts, or ignoring the strata, misses by >= 0.0075
    assert abs(r.lo - lo) < 0.004 and abs(r.hi - hi) < 0.004, (r, lo, hi)


@pytest.mark.parametrize('seed', SEEDS)
@pytest.mark.parametrize('strat', [False, True])
def test_cluster_bootstrap_resamples_exact(seed, strat):
    "Each resampled estimate equals the mean of the rollouts of the drawn tasks (same draws via resample_counts)."
    y, g, s = _clustered(seed, strata=strat)
    r = bootstrap_ci(y, g, n_resamples=300, seed=seed, strata=s, keep_boot=True)
    codes, T, ts = task_index(g, len(y), s)
    W = resample_counts(ts, 300, seed)
    for k in range(0, 300, 37):
        rows = np.concatenate([np.flatnonzero(codes == t) for t in np.repeat(np.arange(T), W[k].astype(int))])
        assert abs(r.boot[k] - y[rows].mean()) < 1e-12
    if strat:  # every resample keeps each stratum's task count
        for h in np.unique(ts): assert (W[:, ts == h].sum(1) == (ts == h).sum()).all()


def test_bootstrap_table_rows_are_bootstrap_ci():
    y, g, _ = _clustered(0)
    df = pd.DataFrame({'y': y, 'g': g, 'cell': np.arange(len(y)) % 3})
    tab = bootstrap_table(df, 'y', by='cell', group='g', n_resamples=500, seed=9)
    for _, row in tab.iterrows():
        sub = df[df.cell == row.cell]
        r = bootstrap_ci(sub.y, sub.g, n_resamples=500, seed=9)
        assert (row['mean'], row['lo'], row['hi'], row['n'], row['n_tasks']) == (r.estimate, r.lo, r.hi, r.n, r.n_tasks)


# --- McNemar and Holm ----------------------------------------------------------------------------------------------

def _pairs_from_counts(n11, b, c, n00, rng):
    a = np.r_[np.ones(n11), np.ones(b), np.zeros(c), np.zeros(n00)]
    bb = np.r_[np.ones(n11), np.zeros(b), np.ones(c), np.zeros(n00)]
    p = rng.permutation(len(a))
    return a[p].astype(int), bb[p].astype(int)


def _mcnemar_cases():
    rng = np.random.default_rng(5)
    cases = [(n11, b, c, n00) for b in range(0, 31) for c in range(0, 31) for n11, n00 in [(3, 2)]]
    cases += [tuple(rng.integers(0, 3000, size=4)) for _ in range(300)]
    cases += [(0, 0, 0, 1), (5, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 1000, 1000, 0), (0, 2500, 2400, 0)]
    return cases


def test_mcnemar_vs_statsmodels():
    rng = np.random.default_rng(6)
    worst = 0.0
    for n11, b, c, n00 in _mcnemar_cases():
        x, y = _pairs_from_counts(n11, b, c, n00, rng)
        r = mcnemar_exact(x, y)
        ref = sm_mcnemar(np.array([[n11, b], [c, n00]]), exact=True)
        assert (r.b, r.c, r.n11, r.n00) == (b, c, n11, n00)
        assert (r.table == np.array([[n11, b], [c, n00]])).all()
        worst = max(worst, abs(r.pvalue - ref.pvalue), abs(r.statistic - ref.statistic))
    assert worst < 1e-12, worst


@pytest.mark.parametrize('seed', range(20))
def test_holm_vs_statsmodels(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 60))
    p = rng.random(m) ** 3
    if seed % 3 == 0: p[: m // 2] = p[0]                     # ties
    if seed % 4 == 0: p[rng.integers(0, m)] = 0.0; p[rng.integers(0, m)] = 1.0
    adj, rej = holm(p, alpha=0.05)
    ref_rej, ref_adj, _, _ = multipletests(p, alpha=0.05, method='holm')
    assert np.max(np.abs(adj - ref_adj)) < 1e-12
    assert (rej == ref_rej).all()


def test_mcnemar_table_vs_statsmodels():
    rng = np.random.default_rng(8)
    n = 400
    base = rng.random(n) < 0.5
    systems = {s: np.where(rng.random(n) < 0.85 - 0.1 * i, base, rng.random(n) < 0.5 + 0.05 * i)
               for i, s in enumerate(['a', 'b', 'c', 'd'])}
    df = pd.concat([pd.DataFrame({'system': s, 'qid': np.arange(n), 'ok': v.astype(int)}) for s, v in systems.items()])
    df = df.sample(frac=1, random_state=1)                    # alignment must not rely on row order
    tab = mcnemar_table(df, 'system', 'ok', 'qid')
    ps = []
    for _, row in tab.iterrows():
        x, y = systems[row.system_a].astype(int), systems[row.system_b].astype(int)
        t = np.array([[np.sum((x == 1) & (y == 1)), np.sum((x == 1) & (y == 0))],
                      [np.sum((x == 0) & (y == 1)), np.sum((x == 0) & (y == 0))]])
        ref = sm_mcnemar(t, exact=True)
        assert abs(row.p - ref.pvalue) < 1e-12 and (row.b, row.c) == (t[0, 1], t[1, 0])
        ps.append(ref.pvalue)
    ref_rej, ref_adj, _, _ = multipletests(ps, method='holm')
    assert np.max(np.abs(tab.p_holm.to_numpy() - ref_adj)) < 1e-12 and (tab.reject.to_numpy() == ref_rej).all()


# --- Cohen's kappa -------------------------------------------------------------------------------------------------

def _raters(seed):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(2, 7))
    labels = [f'L{i}' for i in range(L)]
    n = int(rng.integers(20, 500))
    a = rng.choice(labels, size=n, p=rng.dirichlet(np.ones(L)))
    b = np.where(rng.random(n) < rng.uniform(0.2, 0.95), a, rng.choice(labels, size=n))
    return a, b


def _sm_kappa(a, b):
    labels = sorted(set(a) | set(b))
    t = pd.crosstab(pd.Categorical(a, labels), pd.Categorical(b, labels), dropna=False).to_numpy()
    return sm_kappa(t).kappa


@pytest.mark.parametrize('seed', range(30))
def test_kappa_vs_statsmodels(seed):
    a, b = _raters(seed)
    assert abs(cohens_kappa(a, b) - _sm_kappa(a, b)) < 1e-12


@pytest.mark.parametrize('seed', range(5))
def test_kappa_ci_resamples_vs_statsmodels(seed):
    a, b = _raters(seed)
    g = np.arange(len(a)) // 3                               # items grouped in threes
    r = kappa_ci(a, b, groups=g, n_resamples=200, seed=seed, keep_boot=True)
    codes, T, _ = task_index(g, len(a))
    W = resample_counts(T, 200, seed)
    for k in range(0, 200, 23):
        rows = np.concatenate([np.flatnonzero(codes == t) for t in np.repeat(np.arange(T), W[k].astype(int))])
        assert abs(r.boot[k] - _sm_kappa(a[rows], b[rows])) < 1e-12
    assert r.lo <= r.estimate <= r.hi


# --- Spearman ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('seed', range(30))
def test_spearman_vs_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 400))
    ties = seed % 2 == 0
    x = rng.integers(0, 6, size=n).astype(float) if ties else rng.normal(size=n)
    y = x + rng.normal(size=n) * rng.uniform(0.1, 3)
    if ties: y = np.round(y)
    ref = ss.spearmanr(x, y).statistic
    assert abs(spearman(x, y) - ref) < 1e-12


@pytest.mark.parametrize('seed', range(5))
def test_spearman_ci_resamples_vs_scipy(seed):
    rng = np.random.default_rng(50 + seed)
    g = np.repeat(np.arange(30), rng.integers(1, 6, size=30))
    u = rng.normal(size=30)[g]
    x, y = np.round(u + rng.normal(size=len(g))), np.round(u + rng.normal(size=len(g)))   # many ties
    r = spearman_ci(x, y, groups=g, n_resamples=300, seed=seed, keep_boot=True)
    W = resample_counts(30, 300, seed)
    for k in range(0, 300, 29):
        rows = np.concatenate([np.flatnonzero(g == t) for t in np.repeat(np.arange(30), W[k].astype(int))])
        assert abs(r.boot[k] - ss.spearmanr(x[rows], y[rows]).statistic) < 1e-12
    assert r.estimate == pytest.approx(ss.spearmanr(x, y).statistic, abs=1e-12)


# --- coverage ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('kw', [dict(p=0.6, concentration=2.0, rollouts_per_task=5, seed=0),
                                dict(p=0.3, concentration=5.0, rollouts_per_task=3, seed=1)])
def test_task_bootstrap_coverage(kw):
    cov = coverage_simulation(n_datasets=1000, n_tasks=200, n_resamples=1000, **kw)
    assert cov['n_datasets'] == 1000
    assert 0.93 <= cov['coverage'] <= 0.97, cov['coverage']
