"""The MemGym III section (issue 27 §3-§4): a bad parameter is one line naming it, before any work; `run_gate` on a tiny
corpus gives an IID AUROC equal to scikit-learn's on the same rows, a grouped split, and OOD axes that hold no training
strategy (strategy axis) and no training environment (scenario axis); Table 3's OOD rows are read on the covered subset of
the paper's selection rule; the notebook runs under papermill with tiny parameters and labels its output offline."""
import json, os
import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score, average_precision_score
from section_runner import papermill_section
from memlab.protocols.memgym.gate.section import check_params, run_gate, table3, cohort_table, _toy_frame

TINY = dict(n_tasks=3, ood_strategies=['sliding-window'], ood_env='toy-counter', n_boot=50)      # dialogue (3 families) x rolling summary; toy counter as the other env


@pytest.mark.parametrize('kw,msg', [
    (dict(ood_env='dialogue'), "memgym_gate parameter ood_env: must differ from train_env 'dialogue'"),
    (dict(ood_strategies=['llm-summarizing']), "memgym_gate parameter ood_strategies: ['llm-summarizing'] also in train_strategies"),
    (dict(perturbations=['aggressive_0.9']), "memgym_gate parameter perturbations: unknown ['aggressive_0.9']"),
    (dict(label_source='oracle'), "memgym_gate parameter label_source: 'oracle' not one of"),
    (dict(gates=['llm']), "memgym_gate parameter backend: 'offline' has no model for the llm gate"),
    (dict(gates=['llm'], backend='openai'), 'memgym_gate parameter gate_model: the llm gate needs a model'),
    (dict(label_source='judge'), "memgym_gate parameter judge_model: label_source 'judge' needs the judge's model"),
    (dict(train_env='nowhere'), "memgym_gate parameter train_env: unknown environment 'nowhere'"),
    (dict(safe_precision_floor=1.5), 'memgym_gate parameter safe_precision_floor:'),
    (dict(n_tasks=0), 'memgym_gate parameter n_tasks:'),
    (dict(n_task=3), 'memgym_gate parameter n_task:'),
])
def test_a_bad_parameter_is_one_line(kw, msg):
    with pytest.raises(ValueError) as e: check_params(**kw)
    assert msg in str(e.value) and '\n' not in str(e.value), str(e.value)


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp('gate')
    P = check_params(**TINY)
    return P, run_gate(P, out, log=lambda s: None), out


def test_iid_auroc_is_sklearns_on_the_same_rows(tiny):
    P, G, _ = tiny
    t3 = table3(G.scores, n_boot=0).set_index(['gate', 'axis'])
    for g in P.gates:
        rows = G.scores[(G.scores.gate == g) & (G.scores.axis == 'iid')]
        assert rows.label.nunique() == 2, rows.label.value_counts()
        assert abs(t3.loc[(g, 'iid'), 'auroc'] - roc_auc_score(rows.label, rows.p_safe)) < 1e-12
        assert abs(t3.loc[(g, 'iid'), 'auprc'] - average_precision_score(1 - rows.label, 1 - rows.p_safe)) < 1e-12   # HARMFUL positive
        assert t3.loc[(g, 'iid'), 'n'] == len(rows) == len(G.events['iid'])


def test_the_split_is_grouped_and_the_ood_axes_hold_nothing_of_training(tiny):
    P, G, out = tiny
    s = G.scores
    assert {e.group for e in G.events['train']} and {e.group for e in G.events['iid']}
    assert not {e.group for e in G.events['train']} & {e.group for e in G.events['iid']}        # no family on both sides
    so, sc = s[s.axis == 'strategy-ood'], s[s.axis == 'scenario-ood']
    assert len(so) and len(sc)
    assert not set(so.strategy) & set(P.train_strategies) and set(so.env) == {P.train_env}
    assert set(sc.env) == {P.ood_env} and P.train_env not in set(sc.env)
    assert set(s.axis) == {'iid', 'strategy-ood', 'scenario-ood'} and not (s.event_id.isin([e.event_id for e in G.events['train']])).any()
    rows = [json.loads(l) for l in (out / 'corpus_v2.jsonl').read_text().splitlines()]
    assert rows and all(r['completion'] in (' Y', ' N') and r['prompt'].endswith('\n\nAnswer:') for r in rows)


def test_ood_rows_are_read_on_the_covered_subset():
    f = _toy_frame(seed=1)
    t3 = table3(f, n_boot=0).set_index('axis'); ct = cohort_table(f)
    sc = ct[ct.axis == 'scenario-ood'].set_index('cohort')
    assert sc.loc['web/forum', 'inverted'] and not sc.loc['web/forum', 'kept'] and sc.loc['web/shop', 'kept']
    shop = f[f.group == 'web/shop']
    assert t3.loc['scenario-ood', 'n'] == len(shop) and t3.loc['scenario-ood', 'n_axis'] == (f.axis == 'scenario-ood').sum()
    assert abs(t3.loc['scenario-ood', 'coverage'] - len(shop) / t3.loc['scenario-ood', 'n_axis']) < 1e-12
    assert abs(t3.loc['scenario-ood', 'auroc'] - roc_auc_score(shop.label, shop.p_safe)) < 1e-12
    all_sc = f[f.axis == 'scenario-ood']
    assert abs(t3.loc['scenario-ood', 'auroc_all'] - roc_auc_score(all_sc.label, all_sc.p_safe)) < 1e-12
    small = ct[(ct.axis == 'strategy-ood') & (ct.n < 20)]
    assert len(small) and not small.kept.any()                                                  # below N_strategy: never kept
    assert table3(f, min_scenario=10_000, n_boot=0).set_index('axis').loc['scenario-ood', 'coverage'] == 0


def test_the_notebook_runs_offline_with_tiny_parameters(tmp_path):
    out = tmp_path / 'out'
    env = {**os.environ, 'MEMLAB_OUT': str(out), 'MEMLAB_PROGRESS': '0', 'MEMLAB_FIGURE_CHECK': '1'}
    nb = tmp_path / 'gate.ipynb'
    p = papermill_section('memgym_gate', nb, env, *TINY.items())
    assert p.returncode == 0, p.stderr[-3000:]
    res, fig = out / 'results' / 'memgym_gate', out / 'figures' / 'memgym_gate'
    for t in ('corpus', 'table3_gate', 'cohorts', 'training_curve', 'online'):
        assert 'label' in pd.read_csv(res / f'{t}.csv').columns, t
    assert {'reliability.png', 'threshold_sweep.png', 'training_curve.png', 'online_compression.png'} <= {f.name for f in fig.glob('*.png')}
    assert (res / 'manifest.json').exists() and (res / 'scores.parquet').exists()
    t3 = pd.read_csv(res / 'table3_gate.csv')
    assert set(t3.axis) == {'iid', 'strategy-ood', 'scenario-ood'} and all('no LLM' in l for l in t3.label)
    outputs = json.dumps([c.get('outputs', []) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code'])
    assert 'no LLM' in outputs


def test_a_bad_parameter_under_papermill_stops_before_any_work(tmp_path):
    env = {**os.environ, 'MEMLAB_OUT': str(tmp_path / 'out'), 'MEMLAB_PROGRESS': '0'}
    p = papermill_section('memgym_gate', tmp_path / 'bad.ipynb', env, ('ood_env', 'dialogue'))
    assert p.returncode != 0 and "memgym_gate parameter ood_env: must differ" in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / 'out' / 'results' / 'memgym_gate').exists()


FAKE_KEY = 'sk-memlab-gate-DO-NOT-LEAK-9e21'


def test_the_llm_gate_runs_against_the_loopback_server_and_the_key_leaks_nowhere(tmp_path):
    from loopback import LoopbackServer, default_responder
    out = tmp_path / 'out'
    env = {**os.environ, 'OPENAI_API_KEY': FAKE_KEY, 'MEMLAB_OUT': str(out), 'MEMLAB_CACHE': str(tmp_path / 'c.sqlite'), 'MEMLAB_PROGRESS': '0'}
    with LoopbackServer('openai', responder=default_responder) as srv:
        nb = tmp_path / 'gate-openai.ipynb'
        p = papermill_section('memgym_gate', nb, env, *TINY.items(), ('backend', 'openai'), ('base_url', srv.url), ('gate_model', 'loop-gate'),
                              ('gates', ['heuristic', 'llm']))
        assert p.returncode == 0, p.stderr[-3000:]
        reqs = [r for r in srv.requests if r and r.get('messages')]
    gate_calls = [r for r in reqs if r['model'] == 'loop-gate']
    assert gate_calls and all(r.get('logprobs') and r.get('max_tokens') == 1 for r in gate_calls)
    assert all(r['messages'][-1]['content'].endswith('Answer:') for r in gate_calls)            # the v2 prompt
    t3 = pd.read_csv(out / 'results' / 'memgym_gate' / 'table3_gate.csv')
    llm = t3[t3.gate == 'llm'].set_index('axis')
    n_iid = len(pd.read_parquet(out / 'results' / 'memgym_gate' / 'scores.parquet').query("gate == 'llm' and axis == 'iid'"))
    assert llm.loc['iid', 'n'] == n_iid > 0 and not llm.auroc.isna().all()
    assert len(gate_calls) >= n_iid
    outputs = json.dumps([c.get('outputs', []) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code'])
    assert 'openai:loop-gate' in outputs or 'loop-gate' in outputs
    leaks = [str(f) for d in (out, tmp_path) for f in d.rglob('*') if f.is_file() and FAKE_KEY.encode() in f.read_bytes()]
    assert not leaks and FAKE_KEY not in p.stdout + p.stderr, leaks


def test_findings_do_not_read_a_cohort_auroc_over_a_handful_of_one_class():
    """The default run's observation-masking cohort held 1 SAFE event among 287: its AUROC (0.365) ranks one event, so the
    findings must not call it an inversion; a cohort with enough of both classes still is one."""
    from memlab.protocols.memgym.gate.section import findings, GateRun, MIN_CLASS
    co = pd.DataFrame([dict(gate='heuristic', axis='strategy-ood', cohort='observation-masking', n=287, n_safe=1, n_harmful=286, auroc=0.365,
                            auroc_flipped=0.635, kept=False, inverted=True, why='AUROC 0.365 <= 0.5'),
                       dict(gate='heuristic', axis='scenario-ood', cohort='web/tracker', n=36, n_safe=16, n_harmful=20, auroc=0.395,
                            auroc_flipped=0.605, kept=False, inverted=True, why='AUROC 0.395 <= 0.5')])
    text = findings(pd.DataFrame(columns=['gate', 'axis']), co, GateRun(pd.DataFrame()))
    pol = next(l for l in text.splitlines() if l.startswith('- Polarity'))
    assert 'web/tracker' in pol and 'observation-masking' not in pol, text
    assert f'fewer than {MIN_CLASS} events of one class' in text and '1 SAFE, 286 HARMFUL' in text, text


def test_table3_intervals_resample_episodes_unless_asked_for_events():
    """An episode's events (its original, the counterparts, its other compactions) share a trajectory: by default Table 3's
    intervals draw them together (`gate_metrics` with the episode as the group); `unit='event'` is the repository's row bootstrap."""
    from memlab.protocols.memgym.gate.metrics import gate_metrics
    f = _toy_frame(240, seed=3)
    iid = f[f.axis == 'iid']
    ep, ev = (table3(f, n_boot=200, seed=0, unit=u).set_index('axis').loc['iid'] for u in ('episode', 'event'))
    want = gate_metrics(iid.label.to_numpy(), iid.p_safe.to_numpy(), t=None, n_resamples=200, seed=0, degenerate='skip',
                        groups=iid.task_id.to_numpy()).iloc[0]
    assert (ep.auroc_lo, ep.auroc_hi) == pytest.approx((want.auroc_lo, want.auroc_hi))
    assert (ep.auroc_lo, ep.auroc_hi) != pytest.approx((ev.auroc_lo, ev.auroc_hi)) and ep.auroc == ev.auroc
