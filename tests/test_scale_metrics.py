"""Property tests of seed 000's diagnostics (memlab.protocols.scale.protocol) on random rollout tables."""
import numpy as np, pandas as pd
from hypothesis import given, settings, strategies as st
from memlab.protocols.scale.protocol import outcomes, call_quantile, diagnostics, onset, with_scale, budget_curve, table1

rollouts = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 9)), min_size=1, max_size=60)

@given(rollouts, st.integers(0, 6))
def test_decomposition_sums_to_one(rs, B):
    c, r = zip(*rs); o = outcomes(c, r, B)
    assert (o.sum(axis=1) == 1).all()
    assert o['pass_b'].mean() == np.mean([(ci == 1) and (ri <= B) for ci, ri in rs])
    assert o['exh'].mean() == np.mean([ri > B for _, ri in rs])

@given(st.lists(st.integers(0, 12), min_size=1, max_size=80), st.floats(0.01, 1.0))
def test_quantile_is_definition_2(calls, p):
    brute = min(x for x in range(13) if np.mean(np.array(calls) <= x) >= p - 1e-12)
    assert call_quantile(calls, p) == brute

@given(st.lists(st.floats(0, 1), min_size=1, max_size=6), st.floats(0.05, 0.95))
def test_onset_is_first_scale_below(vals, alpha):
    s = pd.Series(vals, index=[100 * i for i in range(len(vals))])
    got = onset(s, alpha)
    below = [i for i, v in enumerate(vals) if v < alpha]
    assert got == (str(100 * below[0]) if below else f'>{100 * (len(vals) - 1)}')

def frame(seed, n_q=30, scales=(0, 100, 200)):
    rng = np.random.default_rng(seed); rows = []
    for n in scales:
        for q in range(n_q):
            for smp in range(2):
                rows.append(dict(policy='p', memory='m', cond_scale=f's{n // 100}', cond_n_irr=n, query_id=f'q{q}', sample=smp,
                                 n_calls=int(rng.integers(0, 7)), correct=float(rng.random() < 0.7),
                                 error=None if rng.random() > 0.05 else 'APIError'))
    return pd.DataFrame(rows)

@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_budget_monotone_and_errors_excluded(seed):
    raw = frame(seed); df = with_scale(raw)
    assert df.attrs['n_error'] == raw['error'].notna().sum() and len(df) == len(raw) - df.attrs['n_error']
    cur = budget_curve(df, n_resamples=50)
    for _, g in cur.groupby('scale', observed=True):
        assert np.all(np.diff(g.sort_values('B')['pass_b'].to_numpy()) >= -1e-12)
        assert np.allclose(g['pass_b'] + g['p_wrong'] + g['p_exh'], 1)

def test_bootstrap_resamples_queries_not_rollouts():
    "Both samples of a query move together: the CI is that of query-level means."
    df = with_scale(frame(3).assign(error=None))
    d = diagnostics(df, B=2, n_resamples=300, seed=1)
    from memlab.stats import bootstrap_ci
    g = df[df['scale'] == 's0']; o = outcomes(g['correct'], g['n_calls'], 2)
    ref = bootstrap_ci(o['pass_b'].to_numpy(), g['query_id'].to_numpy(), 300, 0.95, 1)
    row = d[d['scale'] == 's0'].iloc[0]
    assert (row['pass_b_lo'], row['pass_b_hi']) == (ref.lo, ref.hi) and row['n_tasks'] == 30 and row['n'] == 60

def test_table1_reads_ends_of_the_ladder():
    df = with_scale(frame(5).assign(error=None)); d = diagnostics(df, n_resamples=50)
    t = table1(d).iloc[0]
    assert t['pass_b_s0'] == d[d['n_irr'] == 0]['pass_b'].item() and t['pass_b_s2'] == d[d['n_irr'] == 200]['pass_b'].item()
    assert not any('s4' in c for c in table1(d).columns)          # three rungs end at s2 (the columns once said s4 whatever the ladder)
