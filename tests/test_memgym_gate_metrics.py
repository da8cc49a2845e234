"""The memory gate's metrics (seed 004 §4.4, Table 3, appendix H) against scikit-learn and hand-made cases.

- AUROC and AUPRC with HARMFUL (label 0) positive on the score 1 - P(SAFE) equal `roc_auc_score` and
  `average_precision_score`, on random scores and on heavily tied ones;
- the sweep's SAFE-F1 / HARMFUL-F1 / precision / recall at t (SAFE iff p >= t) equal `f1_score` & co. with
  `zero_division=0`, as the repository computes them;
- ECE: 15 equal-mass bins of n // 15 events (a partial last bin), checked by hand and, where the bins coincide with
  quantile bins, against `calibration_curve(strategy='quantile')`;
- coverage (the repository's, and the paper's per-cohort selection rule), bootstrap intervals, degenerate inputs.
"""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st
from sklearn.calibration import calibration_curve
from sklearn.metrics import average_precision_score, f1_score, precision_score, recall_score, roc_auc_score

from memlab.protocols.memgym.gate.metrics import (GRID, N_AXIS, PAPER_FLOORS, REPO_FLOORS, auprc, auroc, bootstrap_ci,
                                                  bootstrap_cis, check_scores, cohort_coverage, coverage_at, ece,
                                                  equal_mass_bins, gate_metrics, pick_threshold, reliability_table,
                                                  sweep_table, threshold_sweep)


def scores(n, seed, harmful_share=0.6, levels=None):
    "Labels and P(SAFE) mildly related; `levels` rounds P(SAFE) to that many distinct values (ties)."
    rng = np.random.default_rng(seed)
    y = (rng.uniform(size=n) >= harmful_share).astype(int)
    y[:2] = [0, 1]                                   # both classes present
    p = np.clip(0.4 + 0.2 * y + rng.normal(0, 0.25, n), 0, 1)
    return y, (np.round(p * (levels - 1)) / (levels - 1) if levels else p)


@pytest.mark.parametrize('seed,levels', [(0, None), (1, None), (2, 3), (3, 5), (4, 11), (5, 2)])
def test_auroc_auprc_equal_sklearn(seed, levels):
    y, p = scores(400, seed, levels=levels)
    assert auroc(y, p) == pytest.approx(roc_auc_score(y == 0, 1 - p), abs=1e-12)
    assert auprc(y, p) == pytest.approx(average_precision_score(y == 0, 1 - p), abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.5, 0.75, 0.9, 1.0])),
                min_size=2, max_size=40).filter(lambda r: len({a for a, _ in r}) == 2))
def test_auroc_auprc_property_ties(rows):
    y, p = np.array([a for a, _ in rows]), np.array([b for _, b in rows])
    assert auroc(y, p) == pytest.approx(roc_auc_score(y == 0, 1 - p), abs=1e-12)
    assert auprc(y, p) == pytest.approx(average_precision_score(y == 0, 1 - p), abs=1e-12)
    assert auroc(y, 1 - p) == pytest.approx(1 - auroc(y, p), abs=1e-12)     # the polarity flip


def test_auroc_is_harmful_positive():
    # HARMFUL events at low P(SAFE): a good gate; the SAFE-positive-on-1-p reading would give 0
    y, p = [0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9]
    assert auroc(y, p) == 1.0 and auprc(y, p) == 1.0
    assert auroc(y, [0.1, 0.5, 0.5, 0.9]) == 0.875      # the tied (HARMFUL, SAFE) pair counts one half


@pytest.mark.parametrize('levels', [None, 21])          # 21 levels: P(SAFE) on multiples of 0.05, ties at t
@pytest.mark.parametrize('t', [0.05, 0.3, 0.5, 0.62, 0.88, 0.95])
def test_sweep_matches_sklearn(t, levels):
    y, p = scores(500, 7, levels=levels)
    r = sweep_table(y, p, [t]).iloc[0]
    pred = (p >= t).astype(int)                           # SAFE iff p >= t
    assert r.t == t
    assert r.safe_f1 == pytest.approx(f1_score(y, pred, pos_label=1, zero_division=0))
    assert r.harmful_f1 == pytest.approx(f1_score(y, pred, pos_label=0, zero_division=0))
    assert r.safe_precision == pytest.approx(precision_score(y, pred, pos_label=1, zero_division=0))
    assert r.harmful_recall == pytest.approx(recall_score(y, pred, pos_label=0, zero_division=0))
    assert r.accuracy == pytest.approx((pred == y).mean())
    assert r.false_alarm == pytest.approx(((pred == 0) & (y == 1)).sum() / (y == 1).sum())   # SAFE flagged HARMFUL
    assert r.harmful_miss == pytest.approx(((pred == 1) & (y == 0)).sum() / (y == 0).sum())
    assert r.coverage == pytest.approx(((p >= t) | (p <= 1 - t)).mean())


def test_threshold_tie_predicts_safe():
    r = sweep_table([1, 0, 1], [0.88, 0.5, 0.87], [0.88]).iloc[0]      # p = t is SAFE (p >= t), 0.87 is not
    assert (r.tn, r.fp, r.tp, r.fn) == (1, 1, 1, 0)


def test_f1_zero_division_is_zero():
    r = sweep_table([0, 0, 1], [0.1, 0.2, 0.3], [0.9]).iloc[0]          # nothing predicted SAFE
    assert (r.safe_precision, r.safe_f1) == (0.0, 0.0)
    assert r.safe_f1 == f1_score([0, 0, 1], [0, 0, 0], pos_label=1, zero_division=0)


def test_grid_and_pick():
    assert len(GRID) == 91 and GRID[0] == 0.05 and GRID[-1] == 0.95 and GRID[43] == 0.48
    tab = pd.DataFrame(dict(t=[0.5, 0.6, 0.7, 0.8], tp=1, fp=1, fn=1, tn=1, safe_f1=[0.9, 0.7, 0.8, 0.8],
                            harmful_f1=[0.85, 0.95, 0.95, 0.95], safe_precision=[0.9, 0.9, 0.7, 0.85]))
    assert pick_threshold(tab) == (0.8, '')                                        # paper floors: 0.5 and 0.7 fail
    assert pick_threshold(tab, **REPO_FLOORS) == (0.7, '')                          # repository: SAFE-precision floor 0
    assert pick_threshold(tab, harmful_f1_floor=0.8) == (0.5, '')
    t, why = pick_threshold(tab, harmful_f1_floor=0.99)
    assert t is None and 'HARMFUL-F1 meets its floor at 0 of 4 thresholds (max 0.950)' in why


def test_pick_ties_take_smallest_t():
    tab = pd.DataFrame(dict(t=[0.5, 0.6], tp=1, fp=1, fn=1, tn=1, safe_f1=[0.8, 0.8], harmful_f1=0.95, safe_precision=0.9))
    assert pick_threshold(tab)[0] == 0.5


def test_threshold_sweep_constraint_binds():
    y, p = scores(2000, 0, harmful_share=0.9)
    paper, repo = threshold_sweep(y, p, **PAPER_FLOORS), threshold_sweep(y, p, **REPO_FLOORS)
    for s in (paper, repo):
        ok = s.table[(s.table.harmful_f1 >= s.harmful_f1_floor) & (s.table.safe_precision >= s.safe_precision_floor)]
        if len(ok): assert s.best.safe_f1 == ok.safe_f1.max()
        else: assert s.t_star is None and s.reason
    assert repo.t_star is not None and (paper.t_star is None or paper.best.safe_precision >= 0.8)


def test_equal_mass_bin_sizes():
    assert np.bincount(equal_mass_bins(31)).tolist() == [2] * 15 + [1]
    assert np.bincount(equal_mass_bins(44)).tolist() == [2] * 22        # 44 // 15 = 2: 22 bins
    assert np.bincount(equal_mass_bins(45)).tolist() == [3] * 15
    assert np.bincount(equal_mass_bins(3007)).tolist() == [200] * 15 + [7]
    assert np.bincount(equal_mass_bins(9)).tolist() == [1] * 9
    assert reliability_table(*scores(31, 1)).n.tolist() == [2] * 15 + [1]


def test_ece_hand_cases():
    y = np.tile([1] * 8 + [0] * 2, 15)                                 # 80% SAFE in every bin of 10
    assert ece(y, np.full(150, 0.8)) == pytest.approx(0.0)              # perfectly calibrated
    assert ece(y, np.full(150, 0.95)) == pytest.approx(0.15)            # constant overconfidence
    assert ece(y, np.full(150, 1.0)) == pytest.approx(0.2)
    # 30 events at 0.9 all right, 30 at 0.6 half right; bins of 60 // 15 = 4 in confidence order: seven bins of
    # 0.6 (gap 0.1), one mixed bin (two 0.6 half right, two 0.9 right: confidence 0.75 = accuracy 0.75), seven of 0.9
    y2 = np.r_[np.ones(30, int), np.tile([1, 0], 15)]; p2 = np.r_[np.full(30, 0.9), np.full(30, 0.6)]
    assert reliability_table(y2, p2).gap.round(12).tolist() == [0.1] * 7 + [0.0] + [0.1] * 7
    assert ece(y2, p2) == pytest.approx((28 * 0.1 + 28 * 0.1) / 60)
    assert ece(1 - y2, 1 - p2) == pytest.approx(ece(y2, p2))            # predicted HARMFUL: confidence 1 - p
    # the weights: a partial last bin weighs its share (31 events: 15 bins of 2 right at 1.0, one wrong at 1.0)
    y3, p3 = np.r_[np.ones(30, int), 0], np.ones(31)
    assert ece(y3, p3) == pytest.approx(1 / 31)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_calibration_bins_match_sklearn_quantile(seed):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0, 1, 150); y = (rng.uniform(size=150) < p).astype(int)
    t = reliability_table(y, p, on='p_safe')
    true, pred = calibration_curve(y, p, n_bins=15, strategy='quantile')
    np.testing.assert_allclose(t.accuracy, true); np.testing.assert_allclose(t.confidence, pred)
    assert ece(y, p, on='p_safe') == pytest.approx(np.abs(true - pred).mean())    # equal bins: equal weights
    conf, right = np.maximum(p, 1 - p), ((p >= 0.5).astype(int) == y).astype(int)
    true, pred = calibration_curve(right, conf, n_bins=15, strategy='quantile')
    np.testing.assert_allclose(reliability_table(y, p).accuracy, true)
    assert ece(y, p) == pytest.approx(np.abs(true - pred).mean())


def test_coverage_at():
    p = [0.05, 0.2, 0.5, 0.85, 0.88, 0.95]
    assert coverage_at(p, 0.88) == pytest.approx(3 / 6)                   # 0.05 (<= 0.12), 0.88, 0.95
    assert coverage_at(p, 0.8) == pytest.approx(5 / 6)
    assert coverage_at(p, 0.5) == 1.0
    assert np.isnan(coverage_at([], 0.9))


def cohort_frame():
    rows = []
    def add(c, y, p): rows.extend(dict(c=c, label=a, p_safe=b) for a, b in zip(y, p))
    add('good', [0, 1] * 12, [0.2, 0.8] * 12)                  # n 24, AUROC 1
    add('inverted', [0, 1] * 15, [0.8, 0.2] * 15)              # n 30, AUROC 0 -> flipped 1
    add('chance', [0, 1] * 20, [0.5] * 40)                     # n 40, AUROC 0.5 exactly: not > 0.5
    add('small', [0, 1] * 5, [0.2, 0.8] * 5)                   # n 10 < 20
    add('pure', [1] * 25, np.linspace(0.1, 0.9, 25))           # one class: no AUROC
    return pd.DataFrame(rows)


def test_cohort_rule_strategy_axis():
    cc = cohort_coverage(cohort_frame(), 'c', 'strategy', n_resamples=0)
    t = cc.table.set_index('cohort')
    assert N_AXIS == {'strategy': 20, 'scenario': 30} and cc.min_n == 20
    assert t.kept[t.kept].index.tolist() == ['good']
    assert (cc.n, cc.n_covered, cc.coverage) == (129, 24, pytest.approx(24 / 129))
    assert t.loc['inverted', 'auroc'] == 0 and t.loc['inverted', 'auroc_flipped'] == 1 and t.loc['inverted', 'inverted']
    assert t.loc['chance', 'why'] == 'AUROC 0.500 <= 0.5' and not t.loc['chance', 'inverted']
    assert t.loc['small', 'why'] == 'n 10 < 20' and not t.loc['small', 'inverted']
    assert np.isnan(t.loc['pure', 'auroc']) and t.loc['pure', 'why'] == 'one class only (25 SAFE, 0 HARMFUL): no AUROC'
    assert cc.covered.n.iloc[0] == 24 and cc.covered.auroc.iloc[0] == 1.0
    assert cc.aggregate.n.iloc[0] == 129


def test_cohort_rule_scenario_axis_and_int():
    cc = cohort_coverage(cohort_frame(), 'c', 'scenario', n_resamples=0)
    assert cc.min_n == 30 and not cc.table.kept.any() and cc.coverage == 0.0 and cc.n_covered == 0
    assert cc.covered.note.iloc[0] == 'no events' and np.isnan(cc.covered.auroc.iloc[0])
    assert cohort_coverage(cohort_frame(), 'c', 10, n_resamples=0).table.set_index('cohort').kept['small']
    with pytest.raises(ValueError, match='unknown axis'): cohort_coverage(cohort_frame(), 'c', 'web')


def test_bootstrap_contains_estimate():
    y, p = scores(400, 11)
    cis = bootstrap_cis({'auroc': auroc, 'auprc': auprc, 'ece': ece}, y, p, n_resamples=400, seed=3)
    for k, c in cis.items():
        assert c.lo <= c.estimate <= c.hi and c.lo < c.hi and c.note == '' and c.n_resamples == 400, (k, c)
    again = bootstrap_ci(auroc, y, p, n_resamples=400, seed=3)
    assert (again.lo, again.hi) == (cis['auroc'].lo, cis['auroc'].hi)     # same seed, same resamples
    assert bootstrap_ci(auroc, y, p, n_resamples=400, seed=4).lo != again.lo


def test_bootstrap_groups_draw_together():
    y, p = scores(300, 12)
    g = np.arange(300) // 3
    c = bootstrap_ci(auroc, y, p, n_resamples=200, groups=g)
    assert c.n_tasks == 100 and c.n == 300 and c.lo < c.estimate < c.hi


def test_bootstrap_refusals():
    rng = np.random.default_rng(0)
    y = np.r_[0, 0, np.ones(38, int)]; p = np.r_[0.2, 0.6, rng.uniform(0.3, 1, 38)]
    r = bootstrap_ci(auroc, y, p, n_resamples=300)
    assert np.isnan(r.lo) and np.isnan(r.hi) and r.estimate == auroc(y, p) and 'resamples lack a class' in r.note
    s = bootstrap_ci(auroc, y, p, n_resamples=300, stratify=True)
    assert s.lo <= s.estimate <= s.hi and s.note == ''
    k = bootstrap_ci(auroc, y, p, n_resamples=300, degenerate='skip')
    assert not np.isnan(k.lo) and 'skipped' in k.note
    assert bootstrap_ci(auroc, y[:9], p[:9], n_resamples=50, stratify=True).note == 'too few (n=9 < 10)'
    with pytest.raises(ValueError, match='degenerate'): bootstrap_ci(auroc, y, p, degenerate='drop')


@pytest.mark.parametrize('y', [[1] * 12, [0] * 12])
def test_one_class_is_nan_with_note(y):
    p = np.linspace(0, 1, 12)
    assert np.isnan(auroc(y, p)) and np.isnan(auprc(y, p))
    c = bootstrap_ci(auprc, y, p, n_resamples=50)
    assert np.isnan(c.estimate) and c.note.startswith('one class only')
    row = gate_metrics(y, p, n_resamples=50).iloc[0]
    assert np.isnan(row.auroc) and np.isnan(row.auprc) and row.note.startswith('one class only') and not np.isnan(row.ece)


def test_empty_and_bad_inputs():
    row = gate_metrics([], [], n_resamples=50).iloc[0]
    assert row.n == 0 and row.note == 'no events' and np.isnan(row.auroc) and np.isnan(row.ece)
    with pytest.raises(ValueError, match='labels must be 1 SAFE / 0 HARMFUL'): auroc([0, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match=r'p_safe must be in \[0, 1\]'): ece([0, 1], [0.1, 1.2])
    with pytest.raises(ValueError, match='aligned'): check_scores([0, 1], [0.1])


def test_gate_metrics_row():
    y, p = scores(800, 21, harmful_share=0.8)
    row = gate_metrics(y, p, t=0.6, n_resamples=200).iloc[0]
    at = sweep_table(y, p, [0.6]).iloc[0]
    assert (row.t, row.t_rule) == (0.6, 'given')
    for k in ('accuracy', 'safe_f1', 'harmful_f1', 'false_alarm'):
        assert row[k] == pytest.approx(at[k]) and row[f'{k}_lo'] <= row[k] <= row[f'{k}_hi'], k
    assert row.auroc == pytest.approx(roc_auc_score(y == 0, 1 - p)) and row.ece == pytest.approx(ece(y, p))
    assert row.coverage == pytest.approx(coverage_at(p, 0.6))
    assert (row.n, row.n_harmful + row.n_safe) == (800, 800)
    picked = gate_metrics(y, p, n_resamples=0).iloc[0]
    s = threshold_sweep(y, p)
    assert (picked.t == s.t_star) if s.t_star is not None else (np.isnan(picked.t) and s.reason in picked.note)


def test_cohort_groups_follow_the_covered_subset():
    fr = cohort_frame().assign(traj=lambda d: np.arange(len(d)) // 2)
    cc = cohort_coverage(fr, 'c', 'strategy', group='traj', n_resamples=100)
    assert cc.covered.n.iloc[0] == 24 and cc.aggregate.n.iloc[0] == 129
    with pytest.raises(ValueError, match='group='): cohort_coverage(fr, 'c', groups=fr.traj.to_numpy())
    with pytest.raises(KeyError, match="'run'"): cohort_coverage(fr, 'c', group='run')
