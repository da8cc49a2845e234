"""MemGym paired scoring (seed 004 §3.3, C.5, Table 8) on hand-made frames whose answers are known by hand.

- memory gain = score(with memory) - score(control) on instances paired by id, the same reasoner on both sides;
- transitions are read control -> memory (RU: the control resolved it, memory lost it; UR: memory rescued it), and
  McNemar's b counts memory-only resolutions (= UR), c control-only ones (= RU);
- Holm spans the strategies compared with one control within a (track, reasoner) family, not the whole table;
- C.5: Delta_full = Delta_paired * n_paired / n_scale, the interval scaled alike;
- Table 8: intervals are 1.96 * SE with the sample SD.
The hand frames are smaller than memlab.stats' minimums (10 pairs), so the checks of their intervals and p-values pass
`min_n=0`; tests/test_min_n.py checks the refusal itself.
"""
import numpy as np
import pandas as pd
import pytest

from memlab.protocols.memgym.paired import (GAIN_COLUMNS, HOP_COLUMNS, budget_table, extrapolate, hop_table, memory_gain,
                                            synth_episodes, table8)

IDS = [f'i{k}' for k in range(1, 7)]
CTL = [1.0, 0.6, 0.2, 0.0, 0.8, 0.4]          # resolved (>= 0.5): i1 i2 i5
MEM = [0.9, 0.3, 0.7, 0.1, 1.0, 0.5]          # resolved: i1 i3 i5 i6


def frame(ctl=CTL, mem=MEM, ids=IDS, strategy='a-mem', reasoner='r', **extra) -> pd.DataFrame:
    return pd.DataFrame(dict(track='dr', reasoner=reasoner, strategy=['none'] * len(ctl) + [strategy] * len(mem),
                             instance_id=list(ids[:len(ctl)]) + list(ids[:len(mem)]), score=list(ctl) + list(mem), **extra))


def binary(n_rescued: int, n_lost: int, strategy: str, reasoner: str='r', n_same: int=2) -> pd.DataFrame:
    "Control/memory rows with `n_rescued` U->R, `n_lost` R->U and `n_same` R->R instances."
    n = n_rescued + n_lost + n_same
    ctl = [0.0] * n_rescued + [1.0] * n_lost + [1.0] * n_same
    mem = [1.0] * n_rescued + [0.0] * n_lost + [1.0] * n_same
    return frame(ctl, mem, [f'q{k}' for k in range(n)], strategy, reasoner)


def test_gain_and_transitions_on_six_instances():
    g = memory_gain(frame(), n_resamples=2000, min_n=0).iloc[0]
    assert g.n_paired == 6 and g.unpaired == 0
    assert g.gain == pytest.approx(0.5 / 6)                        # (-0.1 - 0.3 + 0.5 + 0.1 + 0.2 + 0.1) / 6
    assert (g.score_mem, g.score_ctl) == (pytest.approx(np.mean(MEM)), pytest.approx(np.mean(CTL)))
    # control -> memory: i1 R->R, i2 R->U, i3 U->R, i4 U->U, i5 R->R, i6 U->R
    assert (g.RR, g.RU, g.UR, g.UU) == (2, 1, 2, 1)
    assert g.delta_r == pytest.approx((2 - 1) / 6)                 # mean of int(memory.resolved) - int(control.resolved)
    assert g.lo <= g.gain <= g.hi and g.lo < g.hi
    assert list(memory_gain(frame(), n_resamples=10).columns) == ['track', 'reasoner', 'budget', 'strategy', *GAIN_COLUMNS]


def test_gain_sign_is_memory_minus_control():
    g = memory_gain(frame(ctl=MEM, mem=CTL), n_resamples=100).iloc[0]   # sides swapped: the gain flips
    assert g.gain == pytest.approx(-0.5 / 6) and (g.RU, g.UR) == (2, 1)


def test_unpaired_instances_are_counted_and_excluded():
    ep = frame(ctl=CTL, mem=MEM[:5] + [0.9], ids=IDS + ['i7'])
    ep.loc[(ep.strategy == 'a-mem') & (ep.instance_id == 'i6'), 'instance_id'] = 'i7'   # i6 control only, i7 memory only
    g = memory_gain(ep, n_resamples=100).iloc[0]
    assert (g.n_paired, g.unpaired) == (5, 2)
    assert g.gain == pytest.approx((-0.1 - 0.3 + 0.5 + 0.1 + 0.2) / 5)
    assert g.score_ctl == pytest.approx(np.mean(CTL[:5]))
    assert (g.RR, g.RU, g.UR, g.UU) == (2, 1, 1, 1)


def test_mcnemar_b_counts_memory_only_resolutions():
    up = memory_gain(binary(5, 0, 'a-mem'), n_resamples=100, min_n=0).iloc[0]
    assert (up.b, up.c, up.UR, up.RU) == (5, 0, 5, 0)
    assert up.p == pytest.approx(2 * 0.5 ** 5)
    down = memory_gain(binary(0, 5, 'a-mem'), n_resamples=100).iloc[0]
    assert (down.b, down.c, down.UR, down.RU) == (0, 5, 0, 5)
    assert up.delta_r > 0 > down.delta_r


def test_holm_across_strategies_within_each_family():
    ids = [f'q{k}' for k in range(10)]                                        # the control resolves none of ten instances
    ep = pd.concat([pd.DataFrame(dict(track='dr', reasoner=r, strategy=s, instance_id=ids, score=[1.0] * k + [0.0] * (10 - k)))
                    for r in ('r1', 'r2') for s, k in (('none', 0), ('a-mem', 8), ('bm25-notes', 6))])
    t = memory_gain(ep, n_resamples=100).set_index(['reasoner', 'strategy'])
    assert t.loc[('r1', 'a-mem'), 'p'] == pytest.approx(2 / 2 ** 8) and t.loc[('r1', 'bm25-notes'), 'p'] == pytest.approx(2 / 2 ** 6)
    # two tests per reasoner: 2 * 2/256 = 1/64, then max(1/64, 1 * 2/64) = 1/32 (four tests together would give 4 * 2/256)
    assert t.loc[('r1', 'a-mem'), 'p_holm'] == pytest.approx(1 / 64)
    assert t.loc[('r1', 'bm25-notes'), 'p_holm'] == pytest.approx(1 / 32)
    assert t.loc[('r2', 'a-mem'), 'p_holm'] == pytest.approx(1 / 64)
    assert t['reject'].all()


def test_extrapolation_arithmetic():
    assert extrapolate(0.1, 678, 1041) == pytest.approx(0.1 * 678 / 1041)
    assert extrapolate([0.1, -0.3], [556, 10], [1003, 20]) == pytest.approx([0.1 * 556 / 1003, -0.15])
    with pytest.raises(ValueError, match='n_paired <= n_scale'): extrapolate(0.1, 20, 10)


def test_only_crossing_instances_are_paired_and_the_gain_extrapolated():
    ep = frame(crossed=[True] * 4 + [False] * 2 + [True] * 4 + [False] * 2)
    ep.loc[(ep.strategy == 'a-mem') & ~ep.crossed, 'score'] = [0.8, 0.4]   # uncrossed i5, i6: identical to the control
    g = memory_gain(ep, n_resamples=500, min_n=0).iloc[0]
    assert (g.n_paired, g.n_uncrossed, g.n_scale) == (4, 2, 6)
    assert g.gain == pytest.approx((-0.1 - 0.3 + 0.5 + 0.1) / 4)
    assert g.gain_full == pytest.approx(g.gain * 4 / 6)
    assert (g.lo_full, g.hi_full) == (pytest.approx(g.lo * 4 / 6), pytest.approx(g.hi * 4 / 6))
    assert g.gain_full == pytest.approx(memory_gain(ep, crossed_only=False, n_resamples=10).iloc[0].gain)
    assert (g.RR, g.RU, g.UR, g.UU) == (1, 1, 1, 1)                  # transitions on the paired subset only


def test_hop_interval_is_196_standard_errors():
    ep = pd.DataFrame(dict(track='dr', reasoner='r', strategy='bm25-notes', instance_id=list('abcdef'), hops=[3, 3, 3, 3, 5, 6],
                           score=[0, 0.5, 1, 0.5, 0.2, 0.4]))
    t = hop_table(ep, min_n=0).set_index('hop_stratum')
    assert list(t.index) == ['3', '5/6'] and t.loc['3', 'n'] == 4 and t.loc['5/6', 'n'] == 2
    assert t.loc['3', 'mean'] == pytest.approx(0.5)
    assert t.loc['3', 'half'] == pytest.approx(1.96 * np.sqrt(1 / 6) / 2)      # sample SD sqrt(0.5/3), n = 4
    assert t.loc['5/6', 'half'] == pytest.approx(1.96 * np.sqrt(0.02) / np.sqrt(2))
    assert (t.loc['3', 'lo'], t.loc['3', 'hi']) == (pytest.approx(0.5 - t.loc['3', 'half']), pytest.approx(0.5 + t.loc['3', 'half']))
    assert table8(hop_table(ep, min_n=0)).iloc[0]['3-hop (n=4)'] == '0.500 ± 0.400'
    assert list(hop_table(ep).columns) == ['track', 'reasoner', 'strategy', 'hop_stratum', *HOP_COLUMNS]


def test_missing_control_is_a_clear_error():
    with pytest.raises(ValueError, match="no control rows"): memory_gain(frame()[lambda d: d.strategy != 'none'])
    mixed = frame().assign(reasoner=lambda d: np.where(d.strategy == 'none', 'sonnet', 'haiku'))   # control of another reasoner
    with pytest.raises(ValueError, match="no control rows.*haiku"): memory_gain(mixed)
    with pytest.raises(ValueError, match="no control rows"): memory_gain(frame(), control='passthrough')


def test_bad_frames_are_refused():
    with pytest.raises(ValueError, match='repeated row'): memory_gain(pd.concat([frame(), frame().iloc[:1]]))
    with pytest.raises(ValueError, match=r'in \[0, 1\]'): memory_gain(frame(ctl=[1.5] + CTL[1:]))
    with pytest.raises(ValueError, match='outside the Table 8 strata'): hop_table(frame(hops=[2] * 12))


def test_reproducible_by_seed():
    a, b, c = synth_episodes(n_dr=60, n_codeqa=40, seed=5), synth_episodes(n_dr=60, n_codeqa=40, seed=5), synth_episodes(n_dr=60, n_codeqa=40, seed=6)
    assert a.equals(b) and not a.equals(c)
    g1, g2, g3 = (memory_gain(a, n_resamples=300, seed=s) for s in (1, 1, 2))
    assert g1.equals(g2) and not g1['lo'].equals(g3['lo'])
    assert g1['gain'].equals(g3['gain'])                               # the seed moves only the intervals
    t1, t2 = budget_table(a, n_resamples=300, seed=1), budget_table(a, n_resamples=300, seed=1)
    assert t1.equals(t2) and set(t1.budget) == {10_000, 50_000, 100_000, 500_000}
