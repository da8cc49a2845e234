"""SubtleMemory's waterfall and statistics (seed 003 §5, Tables 2, 3, D.5, appendix D.3) on hand-made frames whose answers are known."""
import numpy as np
import pandas as pd
import pytest
from memlab.stats import bootstrap_ci, mcnemar_exact
from memlab.protocols.subtle.waterfall import (accuracy_table, align_stages, best_system, calibration_table, check_frame, paired_oracle,
                                               perfect_table, synth_frame, table3, waterfall, wide, WIDE_ORDER)

RELS = ('complementary', 'complementary', 'nuanced', 'nuanced', 'contradictory', 'contradictory')
COLS = {'complementary': 'Multi-evidence', 'nuanced': 'Temporal', 'contradictory': 'Contradictory'}


def frame(o, p, d, rels=RELS, model='m', prompt='v2', memory='sys', ids=None):
    "One system's oracle, perfect and default verdicts (None: no row in that setting)."
    ids = ids or [f'q{i + 1}' for i in range(len(o))]
    rows = []
    for setting, mem, vals in (('oracle', 'oracle', o), ('perfect', memory, p), ('default', memory, d)):
        rows += [dict(model=model, prompt=prompt, memory=mem, setting=setting, query_id=q, relation_type=r, column=COLS[r], correct=bool(v))
                 for q, r, v in zip(ids, rels, vals) if v is not None]
    return pd.DataFrame(rows)


# q1..q6: oracle 1 1 1 0 1 0 / perfect 1 1 0 1 1 0 / default 1 0 0 1 1 0
HAND = frame([1, 1, 1, 0, 1, 0], [1, 1, 0, 1, 1, 0], [1, 0, 0, 1, 1, 0])


def test_waterfall_counts_by_hand():
    w = waterfall(HAND, n_resamples=500, min_n=0).set_index("scope")   # six hand-made queries: the interval needs the minimum lifted
    # C_oracle = {q1,q2,q3,q5}; C_perfect ∩ C_oracle = {q1,q2,q5}; C_default ∩ C_perfect ∩ C_oracle = {q1,q5}
    assert w.loc['overall', ['n', 'n_oracle', 'n_pres', 'n_ret', 'unaligned']].tolist() == [6, 4, 3, 2, 0]
    assert w.loc['overall', 'r_pres'] == pytest.approx(3 / 4) and w.loc['overall', 'r_ret'] == pytest.approx(2 / 3)
    assert w.loc['overall', ['acc_oracle', 'acc_perfect', 'acc_default']].tolist() == pytest.approx([4 / 6, 4 / 6, 3 / 6])
    assert w.loc['complementary', ['n_oracle', 'n_pres', 'n_ret']].tolist() == [2, 2, 1]
    assert w.loc['contradictory', ['r_pres', 'r_ret']].tolist() == [1.0, 1.0]
    assert w.loc['overall', 'r_pres_lo'] <= 3 / 4 <= w.loc['overall', 'r_pres_hi']


def test_perfect_without_oracle_does_not_count_toward_preservation():
    # q4 is correct under perfect retrieval (and default) but wrong under the oracle
    with_q4 = waterfall(HAND, n_resamples=50).set_index('scope').loc['overall']
    without = waterfall(frame([1, 1, 1, 0, 1, 0], [1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 1, 0]), n_resamples=50).set_index('scope').loc['overall']
    assert (with_q4['n_pres'], with_q4['n_ret']) == (without['n_pres'], without['n_ret']) == (3, 2)
    oracle_right = waterfall(frame([1, 1, 1, 1, 1, 0], [1, 1, 0, 1, 1, 0], [1, 0, 0, 1, 1, 0]), n_resamples=50).set_index('scope').loc['overall']
    assert (oracle_right['n_oracle'], oracle_right['n_pres'], oracle_right['n_ret']) == (5, 4, 3)   # once the oracle is right, q4 counts


def test_unaligned_queries_are_left_out_and_counted():
    f = frame([1, 1, 1, 0, 1, 0, 1, 1], [1, 1, 0, 1, 1, 0, 1, None], [1, 0, 0, 1, 1, 0, None, 1],
              rels=RELS + ('nuanced', 'contradictory'))
    w = waterfall(f, n_resamples=50).set_index('scope')
    assert w.loc['overall', ['n', 'unaligned', 'n_oracle', 'n_pres', 'n_ret']].tolist() == [6, 2, 4, 3, 2]
    assert w.loc['nuanced', 'unaligned'] == 1 and w.loc['contradictory', 'unaligned'] == 1 and w.loc['complementary', 'unaligned'] == 0
    st = align_stages(f)
    assert st['perfect'].isna().sum() == 1 and st['default'].isna().sum() == 1


def test_oracle_of_another_answer_model_is_not_used():
    f = pd.concat([frame([1] * 6, [1] * 6, [1] * 6, model='a'), frame([0] * 6, [1] * 6, [1] * 6, model='b')], ignore_index=True)
    w = waterfall(f, n_resamples=50).set_index(['model', 'scope'])
    assert w.loc[('a', 'overall'), 'r_pres'] == 1.0 and w.loc[('b', 'overall'), 'n_oracle'] == 0


def test_empty_denominators_give_nan_not_a_crash():
    w = waterfall(frame([0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1, 1]), n_resamples=200).set_index('scope')
    for scope in ('complementary', 'contradictory'):            # no oracle success: R_pres and R_ret undefined
        assert w.loc[scope, 'n_oracle'] == 0 and np.isnan(w.loc[scope, ['r_pres', 'r_pres_lo', 'r_ret', 'r_ret_hi']].astype(float)).all()
    assert w.loc['nuanced', 'r_pres'] == 0.0 and np.isnan(w.loc['nuanced', 'r_ret'])   # nothing preserved: R_ret undefined
    assert w.loc['overall', 'r_pres'] == 0.0


def test_stratified_bootstrap_is_reproducible_and_narrower():
    f = synth_frame(n_instances=90, seed=5)
    a1, a2, a3 = (accuracy_table(f, n_resamples=800, seed=s) for s in (1, 1, 2))
    assert a1.equals(a2) and not a1['lo'].equals(a3['lo'])
    w1, w2 = waterfall(f, n_resamples=400, seed=4), waterfall(f, n_resamples=400, seed=4)
    assert w1.equals(w2)
    rel = np.repeat(['complementary', 'nuanced', 'contradictory'], 100)
    toy = pd.DataFrame(dict(model='m', prompt='v2', memory='a', setting='default', query_id=[f'q{i}' for i in range(300)], relation_type=rel,
                            column=[COLS[r] for r in rel], correct=np.r_[np.ones(100), np.zeros(100), np.arange(100) % 2].astype(bool)))
    s = accuracy_table(toy, n_resamples=3000).iloc[0]
    u = bootstrap_ci(toy['correct'].to_numpy(float), toy['query_id'].to_numpy(), 3000)
    assert s['level'] == 'overall' and s['acc'] == pytest.approx(0.5) and s['lo'] <= 0.5 <= s['hi']
    assert s['hi'] - s['lo'] < 0.75 * (u.hi - u.lo)
    rel_row = accuracy_table(toy, n_resamples=500).set_index('value').loc['contradictory']
    assert rel_row['n'] == 100 and rel_row['acc'] == pytest.approx(0.5)


def test_mcnemar_b_c_and_holm_by_hand():
    # model a: oracle right on all 10, best system right on q1, q2 only -> b = 8, c = 0, p = 2 * 0.5**8
    # model b: oracle right on q1..q4 + q9, system right on q1, q5 + q9 -> b = 3, c = 1, p = 2 * 5/16
    ids = [f'q{i + 1}' for i in range(10)]
    rels = ['complementary', 'nuanced', 'contradictory', 'nuanced', 'complementary'] * 2
    fa = frame([1] * 10, [1] * 10, [1, 1] + [0] * 8, rels=rels, model='a', ids=ids)
    fb = frame([1, 1, 1, 1, 0, 0, 0, 0, 1, 0], [1] * 10, [1, 0, 0, 0, 1, 0, 0, 0, 1, 0], rels=rels, model='b', ids=ids)
    t = paired_oracle(pd.concat([fa, fb], ignore_index=True), n_resamples=500).set_index('model')
    assert t.loc['a', ['b', 'c', 'n']].tolist() == [8, 0, 10] and t.loc['b', ['b', 'c']].tolist() == [3, 1]
    assert t.loc['a', 'p'] == pytest.approx(2 * 0.5 ** 8) and t.loc['b', 'p'] == pytest.approx(0.625)
    assert t.loc['a', 'p_holm'] == pytest.approx(2 * 2 * 0.5 ** 8) and t.loc['b', 'p_holm'] == pytest.approx(0.625)
    assert t['reject'].tolist() == [True, False]
    assert t.loc['a', 'diff'] == pytest.approx(0.8) and t.loc['b', 'diff'] == pytest.approx(0.2)
    assert t.loc['a', 'lo'] <= 0.8 <= t.loc['a', 'hi']


def test_best_system_choice_and_tie_break():
    rows = []
    for mem, vals in (('zeta', [1, 1, 1, 0]), ('alpha', [1, 1, 0, 1]), ('beta', [1, 0, 0, 0])):
        rows.append(frame([1, 1, 1, 1], [1, 1, 1, 1], vals, rels=RELS[:4], memory=mem))
    f = pd.concat(rows, ignore_index=True).drop_duplicates(['memory', 'setting', 'query_id'])
    assert best_system(f) == 'alpha'                                           # zeta and alpha tie at 3/4: the name sorting first
    t = paired_oracle(f, n_resamples=100).iloc[0]
    assert t['best'] == 'alpha' and (t['b'], t['c']) == (1, 0)
    f.loc[(f.memory == 'zeta') & (f.setting == 'default') & (f.query_id == 'q4'), 'correct'] = True
    assert best_system(f) == 'zeta'                                            # strictly higher accuracy wins over the name


def test_calibration_difference_by_hand():
    base = dict(model='m', memory='oracle', setting='oracle')
    rows = [dict(base, prompt=pr, query_id=f'q{i}', relation_type=r, column=COLS[r], correct=bool(v))
            for pr, vals in (('v1', [1, 0, 0, 0, 1, 0]), ('v2', [1, 1, 1, 0, 1, 1])) for i, (r, v) in enumerate(zip(RELS, vals))]
    rows.append(dict(base, prompt='v2', query_id='q9', relation_type='nuanced', column='Temporal', correct=True))   # only v2 answered it
    rows += [dict(r, model='solo') for r in rows if r['prompt'] == 'v1']
    c = calibration_table(pd.DataFrame(rows), n_resamples=500).set_index(['model', 'prompt', 'level', 'value'])
    assert c.loc[('m', 'v2 - v1', 'overall', 'overall'), ['acc', 'n', 'unpaired']].tolist() == pytest.approx([3 / 6, 6, 1])
    assert c.loc[('m', 'v2 - v1', 'relation', 'contradictory'), 'acc'] == pytest.approx(0.5)
    assert c.loc[('m', 'v2', 'overall', 'overall'), 'acc'] == pytest.approx(6 / 7)
    assert not any(k[0] == 'solo' and k[1] == 'v2 - v1' for k in c.index)   # a model with one prompt has no difference


def test_wide_tables_by_hand():
    f = pd.concat([HAND, frame([1] * 6, [0] * 6, [0, 0, 0, 0, 0, 1], memory='other')], ignore_index=True)
    f = f.drop_duplicates(['memory', 'setting', 'query_id'])
    t3 = table3(f, n_resamples=100)
    assert list(t3.columns) == ['model', 'prompt', 'memory', *WIDE_ORDER] and t3['memory'].tolist() == ['other', 'sys', 'oracle']
    s = t3.set_index('memory')
    assert s.loc['sys', 'overall'] == pytest.approx(3 / 6) and s.loc['sys', 'complementary'] == pytest.approx(1 / 2)
    assert s.loc['oracle', 'nuanced'] == pytest.approx(1 / 2) and np.isnan(s.loc['sys', 'Any-one'])
    pt = perfect_table(f, n_resamples=100).set_index('memory')
    assert list(pt.index) == ['other', 'sys'] and pt.loc['sys', 'overall'] == pytest.approx(4 / 6) and pt.loc['other', 'overall'] == 0.0
    n = wide(accuracy_table(f, n_resamples=50), what='n').set_index(['memory', 'setting'])
    assert n.loc[('sys', 'default'), 'Temporal'] == 2


def test_bad_frames_are_refused():
    with pytest.raises(ValueError, match='repeated row'): check_frame(pd.concat([HAND, HAND.iloc[:1]]))
    with pytest.raises(ValueError, match='missing'): check_frame(HAND.assign(correct=HAND['correct'].astype(object).where(HAND.index > 0)))
    with pytest.raises(ValueError, match='unknown settings'): waterfall(HAND.replace({'setting': {'perfect': 'readback'}}))
