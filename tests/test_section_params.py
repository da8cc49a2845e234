"""Every parameter combination runs: each section notebook under papermill with non-default parameters (one memory, one
tier, a one- and a three-rung ladder, no iterative memory, a LongMemEval oracle file with a separate pool), small enough
for CI, and the default offline scale-ladder run shows both of seed 000's failure regimes (checked here, not in the
notebook, so that a researcher's parameters never trip it).

The notebooks run two at a time (each in its own kernel); each writes under its own out_root.
"""
import os, subprocess, sys
from typing import Optional
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
FX = ROOT / 'tests' / 'fixtures'
HALUMEM_EXCERPT = ROOT.parent / 'shared' / 'fixtures' / 'halumem' / 'halumem_user_excerpt.jsonl'   # real format (may be absent)
SECTIONS = ROOT / 'nbs' / 'sections'

CASES = {
    'scale-one-rung-one-memory': ('scale_ladder', "memories: [bm25]\ntiers: [strong]\nladder: [0]\nn_queries: 4\npool_size: 10\nn_resamples: 20"),
    'scale-three-rungs-iterative-only': ('scale_ladder', "memories: [items]\ntiers: [weak]\nladder: [0, 10, 20]\nn_queries: 4\npool_size: 30\nn_resamples: 20"),
    'scale-lme-oracle-with-pool': ('scale_ladder', f"dataset: longmemeval\ndata_path: {FX / 'longmemeval_oracle.json'}\n"
                                                   f"pool_path: {FX / 'longmemeval_s_cleaned.json'}\nn_queries: null\nladder: [0, 2, 4]\n"
                                                   "memories: [bm25, entity-graph]\ntiers: [medium]\nn_resamples: 20"),
    'scale-defaults': ('scale_ladder', ''),
    'scale-locomo-by-record-by-type': ('scale_ladder', f"dataset: locomo\ndata_path: {FX / 'locomo10.json'}\npool_path: {FX / 'longmemeval_s_cleaned.json'}\n"
                                                       "n_queries: 8\nladder: [0, 2]\nmemories: [bm25]\ntiers: [strong]\nbootstrap_unit: record\n"
                                                       "by_type: true\nn_resamples: 20"),
    'walkthrough-weak-small-k': ('walkthrough', "tier: weak\nk: 3\nwindow_tokens: 600\nn_instances: 2\nqueries_per_instance: 5\nn_filler: 10\nn_resamples: 50"),
    'memtrace-defaults': ('memtrace', ''),
    'memtrace-window-holds-history': ('memtrace', "memories: [long-context, bm25]\ntiers: [strong]\nwindow_tokens: 1000000\nn_resamples: 50"),
    'memtrace-halumem-fixture-third-person': ('memtrace', f"dataset: halumem\ndata_path: {FX / 'halumem_medium.jsonl'}\nperson: third\n"
                                                          "memories: [long-context]\ntiers: [weak]\nn_windows: 4\nanchored: false\nn_resamples: 50"),
    'mab-one-agent-one-family': ('memoryagentbench', "agents: [bm25]\nfamilies: [ruler_qa1]\nablation_families: [ruler_qa1]\ntopk_ablation: [2]\n"
                                                     "chunk_sizes: [512]\ncontext_lengths: [2000]\ncontext_tokens: 2000\nquestions_per_context: 3\nn_resamples: 50"),
}
CASES.update({
    'subtlememory-defaults': ('subtlememory', ''),
    'subtlememory-fixture-by-message': ('subtlememory', f"dataset: released\ndata_path: {FX / 'subtlememory'}\ngranularity: message\n"
                                                        "memories: [items, long-context]\nwindow_tokens: 300\ntiers: [weak]\nn_resamples: 50"),
    'subtlememory-batches-no-oracle': ('subtlememory', "settings: [perfect, default]\ngranularity: batch\nbatch: 3\nmemories: [bm25]\n"
                                                       "tiers: [medium]\nn_personas: 1\nn_unrelated: 10\nn_resamples: 50"),
})
CASES.update({
    'memgym-defaults': ('memgym', ''),
    'memgym-dr-unverified-windowing': ('memgym', "tracks: [dr]\nstrategies: [none, observation-masking, sliding-window]\ndr_hops: [3]\n"
                                                 "dr_budgets: [10000]\nn_dr: 3\nverify: false\nn_resamples: 50"),
    'memgym-codeqa-pipeline': ('memgym', "tracks: [codeqa]\nstrategies: [none, pipeline, amem-notes]\ncodeqa_budgets: [10000]\nn_codeqa: 3\n"
                                         "n_resamples: 50"),
})
CASES.update({
    'memgym-envs-defaults': ('memgym_envs', ''),
    'memgym-envs-dialogue-unbounded-windows': ('memgym_envs', "envs: [dialogue]\nstrategies: [none, llm-summarizing, observation-masking]\nn_tasks: 4\n"
                                                             "ablation_envs: [dialogue]\nreplay_envs: []\n"
                                                             "env_settings: {dialogue: {window_tokens: null, env_args: {user_window_tokens: null}}}\nn_resamples: 50"),
})
CASES.update({
    'memgym-gate-defaults': ('memgym_gate', ''),
    'memgym-gate-construction-labels': ('memgym_gate', "label_source: construction\ngates: [heuristic]\nood_strategies: [sliding-window]\n"
                                                       "n_tasks: 3\nn_boot: 50"),
})
SUBTLE_EXCERPT = ROOT.parent / 'shared' / 'fixtures' / 'subtlememory'   # real format (may be absent)
if SUBTLE_EXCERPT.exists():
    CASES['subtlememory-real-excerpt'] = ('subtlememory', f"dataset: released\ndata_path: {SUBTLE_EXCERPT}\nk: 5\nn_resamples: 50")
if HALUMEM_EXCERPT.exists():
    CASES['memtrace-real-excerpt'] = ('memtrace', f"dataset: halumem\ndata_path: {HALUMEM_EXCERPT}\nn_resamples: 50")


def papermill(name: str, tmp: Path) -> subprocess.CompletedProcess:
    section, params = CASES[name]
    out = tmp / name
    env = {**os.environ, 'MEMLAB_OUT': str(out), 'MEMLAB_CACHE': str(tmp / f'{name}.sqlite'), 'MEMLAB_FIGURE_CHECK': '1'}   # figures: no overlapping text
    env.pop('MEMLAB_PROGRESS', None)                          # progress bars on, as in a researcher's run
    args = [sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(SECTIONS), str(SECTIONS / f'{section}.ipynb'),
            str(tmp / f'{name}.ipynb'), '--log-level', 'WARNING']
    return subprocess.run(args + (['-y', params] if params else []), env=env, capture_output=True, text=True, timeout=900)


# `make test` runs nbval first: it executes every section at its defaults with MEMLAB_OUT=build/test-out and passes that
# folder here, so the '-defaults' cases read those runs' tables instead of running the same notebook again.
SHARED = os.environ.get('MEMLAB_SECTION_RUNS')


def shared_run(name: str) -> Optional[Path]:
    "The results folder of nbval's run of this case's section, when the case is a section's defaults and that run exists."
    section, params = CASES[name]
    res = Path(SHARED) / 'results' / section if SHARED and not params else None
    return res if res is not None and any(res.glob('*.csv')) else None


@pytest.fixture(scope='module')
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp('sections')
    todo = [n for n in CASES if shared_run(n) is None]
    with ThreadPoolExecutor(2) as ex: done = dict(zip(todo, ex.map(lambda n: papermill(n, tmp), todo)))
    out = {n: (r, tmp / n / 'results' / CASES[n][0], tmp / f'{n}.ipynb') for n, r in done.items()}
    return out | {n: (subprocess.CompletedProcess([], 0, '', ''), shared_run(n), None) for n in CASES if n not in done}


@pytest.mark.parametrize('name', list(CASES))
def test_section_runs(runs, name):
    r, results, nb = runs[name]
    assert r.returncode == 0, r.stderr[-3000:]
    tables = list(results.glob('*.csv'))
    assert tables, f'no table written under {results}'
    for t in tables: assert 'label' in pd.read_csv(t).columns, f'{t.name} does not say what produced it'
    if nb is not None:                                     # nbval's shared runs keep no notebook (progress bars off there)
        assert 'application/vnd.jupyter.widget' not in nb.read_text(), 'a saved notebook holds a (frozen) widget progress bar'


def test_scale_tables_name_the_ladder_ends(runs):
    _, one, _ = runs['scale-one-rung-one-memory']
    assert {'pass_b_s0', 'P90R_s0'} <= set(pd.read_csv(one / 'table1.csv').columns)
    _, three, _ = runs['scale-three-rungs-iterative-only']
    t1, t3 = pd.read_csv(three / 'table1.csv'), pd.read_csv(three / 'table3.csv')
    assert {'pass_b_s2', 'P90R_s2'} <= set(t1.columns) and not any('s4' in c for c in [*t1.columns, *t3.columns])
    _, lme, _ = runs['scale-lme-oracle-with-pool']
    t4 = pd.read_csv(lme / 'table4.csv')
    assert t4['N_irr'].tolist() == [0, 2, 4], t4            # the oracle file alone holds no irrelevant sessions: the pool does
    _, loc, _ = runs['scale-locomo-by-record-by-type']
    by = pd.read_csv(loc / 'table1_by_type.csv')
    assert {'qtype', 'pass_b_s0', 'pass_b_s1'} <= set(by.columns) and by['qtype'].nunique() > 1, by


def test_default_offline_run_shows_both_failure_regimes(runs):
    "Seed 000's two regimes on the default run: a single-pass interface wrong within budget more often at the last scale,"
    " and an iterative interface whose weakest tier exceeds B0 more than its strongest."
    _, results, _ = runs['scale-defaults']
    d = pd.read_csv(results / 'diagnostics.csv'); d['mem'] = d['memory'].str.replace(r'\[.*', '', regex=True)
    lo, hi = d['n_irr'].min(), d['n_irr'].max()
    single = d[d['mem'].isin(['bm25', 'ppr-graph'])]
    p = single.pivot_table(index=['policy', 'mem'], columns='n_irr', values='p_wrong')
    within = (p[hi] > p[lo]) & (single.groupby(['policy', 'mem'])['p_exh'].max() == 0)
    exh = d[d['mem'].isin(['items', 'entity-graph']) & (d['n_irr'] == hi)].pivot_table(index='mem', columns='policy', values='p_exh')
    exceed = exh['offline-reader[tier=weak]'] > exh['offline-reader[tier=strong]']
    assert within.any(), p
    assert exceed.any(), exh


def test_default_offline_memtrace_run_shows_every_view(runs):
    """Seed 002's views on the default offline run, each with its mechanism and the control under which it vanishes
    (checked here, never in the notebook). The reader's ceiling is 1.00 on every type with gold evidence
    (tests/test_memtrace_ceiling.py), so what differs below is what the memory kept."""
    _, res, _ = runs['memtrace-defaults']
    t3 = pd.read_csv(res / 'table3_maintenance.csv')
    fresh = t3.pivot_table(index='system', columns='qtype', values='fresh')
    sat = t3.pivot_table(index='system', columns='qtype', values='saturated')
    lc = [s for s in fresh.index if s.startswith('long-context')]
    stores = [s for s in fresh.index if not s.startswith('long-context') and 'strong' in s]
    # forgetting: the long-context window evicts early sessions, so saturated facts fall below fresh ones; the stores keep them
    assert lc and all(sat.loc[s, 'current'] < fresh.loc[s, 'current'] - 0.3 for s in lc), (fresh.loc[lc], sat.loc[lc])
    assert all(sat.loc[s, 'current'] >= 0.95 for s in stores), sat.loc[stores]
    t4 = pd.read_csv(res / 'table4_conditions.csv').set_index(['system', 'probes'])
    strong = [s for s in t4.index.get_level_values(0).unique() if 'strong' in s]
    weak = [s for s in t4.index.get_level_values(0).unique() if 'weak' in s]
    # boundary: the strong tier abstains without support, the weak one answers on partial support (Tier.answer_min)
    assert min(t4.loc[(s, 'boundary'), 'hallucination'] for s in weak) > max(t4.loc[(s, 'boundary'), 'hallucination'] for s in strong), t4
    # conflict: a false premise is rejected by naming the remembered value, which the stores hold and the window evicted
    assert all(t4.loc[(s, 'conflict'), 'gist'] >= 0.9 for s in strong if not s.startswith('long-context')), t4
    assert all(t4.loc[(s, 'conflict'), 'gist'] < 0.9 for s in strong if s.startswith('long-context')), t4


def test_memtrace_forgetting_vanishes_with_a_window_that_holds_the_history(runs):
    "The control of the two eviction findings above: a window that holds every session forgets nothing and resolves conflicts."
    _, res, _ = runs['memtrace-window-holds-history']
    t3 = pd.read_csv(res / 'table3_maintenance.csv').set_index(['system', 'qtype'])
    lc = [s for s in t3.index.get_level_values(0).unique() if s.startswith('long-context')]
    assert lc and all(t3.loc[(s, 'current'), 'saturated'] >= 0.95 for s in lc), t3
    t4 = pd.read_csv(res / 'table4_conditions.csv').set_index(['system', 'probes'])
    assert all(t4.loc[(s, 'conflict'), 'gist'] >= 0.9 for s in lc), t4


def test_memtrace_reads_halumem_files_end_to_end(runs):
    "The HaluMem fixture (Medium, quirks) and the real-format excerpt go through the whole section."
    names = [n for n in ('memtrace-halumem-fixture-third-person', 'memtrace-real-excerpt') if n in runs]
    for n in names:
        _, res, _ = runs[n]
        assert {'table2_kps.csv', 'table3_maintenance.csv', 'table4_conditions.csv', 'table5_reach_use.csv'} <= {p.name for p in res.glob('*.csv')}
        kps = pd.read_csv(res / 'table2_kps.csv')
        assert kps['KPs'].sum() > 0 and set(kps['kp_group']) == {'static', 'dynamic', 'preference', 'conflict', 'boundary'}


def test_default_offline_subtlememory_run_locates_failures_in_the_right_stage(runs):
    """Seed 003's waterfall on the default offline run (checked here, never in the notebook): the long-context window evicts
    early sessions, so preservation fails there and only there (its control, a window that holds the history, is in
    tests/test_subtle_controls.py); the hashed dense memory retrieves the variants less often than BM25; and under oracle
    the tiers order by their relation skills (tests/test_subtle_reader_ceiling.py: strong 1.00 with gold evidence). The
    earlier claim that the oracle beats the best system (D.3, b > c) came from sets that repeated one template, whose
    siblings crowded the top-k; with a topic and values per set the strong tier with BM25 matches the oracle."""
    _, res, _ = runs['subtlememory-defaults']
    wf = pd.read_csv(res / 'waterfall.csv')
    ov = wf[(wf['scope'] == 'overall') & (wf['model'] == 'reader-strong')].assign(mem=lambda d: d['memory'].str.replace(r'\[.*', '', regex=True))
    r = ov.set_index('mem')
    assert (r.drop(index='long-context')['r_pres'] == 1.0).all() and r.loc['long-context', 'r_pres'] < 0.9, r[['r_pres', 'r_ret']]
    assert r.loc['dense', 'r_ret'] < r.loc['bm25', 'r_ret'], r[['r_pres', 'r_ret']]
    t3 = pd.read_csv(res / 'table3_accuracy.csv')
    orc = t3[t3['memory'] == 'oracle'].set_index('model')['overall']
    assert orc['reader-strong'] > orc['reader-medium'] > orc['reader-weak'], orc


def test_subtlememory_reads_released_layouts_end_to_end(runs):
    "memlab's fixtures (ingested by message) and the real-format excerpt go through the whole section."
    for n in [n for n in ('subtlememory-fixture-by-message', 'subtlememory-real-excerpt') if n in runs]:
        _, res, _ = runs[n]
        assert {'table3_accuracy.csv', 'waterfall.csv', 'tableD5_perfect_retrieval.csv', 'table2_calibration.csv', 'tableD3_paired.csv'} <= {p.name for p in res.glob('*.csv')}
    _, res, _ = runs['subtlememory-batches-no-oracle']
    assert 'waterfall.csv' not in {p.name for p in res.glob('*.csv')} and (res / 'tableD5_perfect_retrieval.csv').exists()


def test_default_offline_memgym_run_pairs_memory_against_none(runs):
    """Seed 004's pairing on the default offline run (checked here, never in the notebook): the None control answers from the
    last visible documents alone, so it scores 0 and every strategy's gain is its score; on DR, flat retrieval over notes
    loses the middle bridge facts as hops grow (they share no word with the question) while A-Mem-like links and
    question-aware summaries keep them, and the summaries' gain grows with hops; the gains are larger at the larger DR budget
    for the linking and summarizing strategies (under less token pressure a strategy compacts less, and full eviction then
    removes the raw turns it still held)."""
    _, res, _ = runs['memgym-defaults']
    mg = pd.read_csv(res / 'memory_gain.csv')
    assert (mg['score_ctl'] == 0).all() and (mg['gain'] > 0).all(), mg[['track', 'budget', 'strategy', 'gain']]
    gh = pd.read_csv(res / 'memory_gain_by_hop.csv').pivot_table(index='strategy', columns='hop_stratum', values='gain')
    assert gh.loc['bm25-notes', '3'] > gh.loc['bm25-notes', '5/6'], gh
    assert gh.loc['amem-notes', '5/6'] > gh.loc['bm25-notes', '5/6'] and gh.loc['llm-summarizing', '5/6'] > gh.loc['bm25-notes', '5/6'], gh
    assert gh.loc['llm-summarizing', '3'] < gh.loc['llm-summarizing', '4'] < gh.loc['llm-summarizing', '5/6'], gh   # the summaries' gain grows with hops
    dr = mg[mg['track'] == 'dr'].pivot_table(index='strategy', columns='budget', values='gain')
    assert (dr[dr.columns.max()] > dr[dr.columns.min()])[['amem-notes', 'llm-summarizing']].all(), dr


def test_default_offline_memgym_distractors_mislead_the_strategies_that_keep_them(runs):
    """Issue 15, item 6: distractors mislead a strategy that keeps them. The None control keeps no notes and is never misled;
    an answer follows a DR contradiction only when the notes kept it; the summarizing strategies keep the contradictions in
    (nearly) every DR episode and follow them in a large share; flat retrieval over notes scores higher on the episodes
    whose notes kept no contradiction."""
    _, res, _ = runs['memgym-defaults']
    dt = pd.read_csv(res / 'distractors.csv')
    none = dt[dt['strategy'] == 'none']
    assert len(none) and (none['kept'] == 0).all() and (none['misled'] == 0).all(), none
    dr = dt[dt['track'] == 'dr'].set_index(['strategy', 'budget'])
    assert (dr['misled_when_not_kept'].fillna(0) == 0).all(), dr['misled_when_not_kept']
    summ = dr.loc[['llm-summarizing', 'structured-summary']]
    assert (summ['kept'] >= 0.9).all() and (summ['misled'] >= 0.3).all(), summ[['kept', 'misled']]
    bm = dr.loc['bm25-notes']
    assert (bm['score_when_not_kept'] > bm['score_when_kept']).all(), bm[['score_when_kept', 'score_when_not_kept']]
    cq = dt[(dt['track'] == 'codeqa') & (dt['strategy'] != 'none')]
    assert (cq['misled_when_not_kept'].fillna(0) == 0).all() and (cq['noise_rejection'] < 1).any(), cq


def test_default_offline_memgym_envs_run_shows_memory_where_state_is_hidden(runs):
    """Seed 004's interactive environments on the default offline run (checked here, never in the notebook). Every task is
    solvable when nothing is forgotten (the agents' ceiling, an unbounded window); with the section's window and no memory
    the dialogue agent loses the constraints the user stated early and the web agent the items it already handled, and the
    rolling summary, which keeps those sentences, solves more of them than the None control on the same tasks."""
    _, res, _ = runs['memgym-envs-defaults']
    ct = pd.read_csv(res / 'agent_ceiling.csv')
    al = ct[ct['domain'] == 'all'].set_index('env')
    assert (al['unbounded_window'] == 1.0).all(), al
    assert (al.loc[['dialogue', 'web'], 'no_memory'] < 1.0).all(), al
    t5 = pd.read_csv(res / 'table5_limexc.csv').pivot_table(index='track', columns='strategy', values='resolved')
    assert (t5.loc[['dialogue', 'web'], 'llm-summarizing'] > t5.loc[['dialogue', 'web'], 'none']).all(), t5
    assert (res / 'table7_web.csv').exists() and (res / 'ablation_dialogue.csv').exists()


def test_memgym_envs_gain_vanishes_when_nothing_is_forgotten(runs):
    "The control: with unbounded windows on the agent and the user the None control solves every dialogue: no strategy can gain (a lossy summary may still lose)."
    _, res, _ = runs['memgym-envs-dialogue-unbounded-windows']
    t5 = pd.read_csv(res / 'table5_limexc.csv').set_index('strategy')
    assert t5.loc['none', 'resolved'] == t5.loc['none', 'n'] and (t5['delta_pp'] <= 0).all(), t5
    ab = pd.read_csv(res / 'ablation_dialogue.csv')
    assert (ab['gain'] <= 0).all(), ab


def test_default_offline_memgym_gate_run_ranks_events_by_what_the_fork_needs(runs):
    """Seed 004's gate on the default offline run (checked here, never in the notebook). Labels are episode outcomes: each
    counterpart's episode forked at its compaction and continued live from the perturbed view. Both offline gates rank the
    IID split above chance (the heuristic: the share of the values the later trajectory uses that survive; its control, in
    tests/test_memgym_gate_gates.py, is another task's future and no future, under which it falls to 0.65 and 0.50)."""
    _, res, _ = runs['memgym-gate-defaults']
    t3 = pd.read_csv(res / 'table3_gate.csv').set_index(['gate', 'axis'])
    for g in ('heuristic', 'sklearn'):         # 77 events of 4 episodes: a point estimate (its interval needs 10 episodes: refused, noted)
        assert t3.loc[(g, 'iid'), 'auroc'] > 0.6 and 'too few' in t3.loc[(g, 'iid'), 'note'], t3.loc[g]
    co = pd.read_csv(res / 'corpus.csv').set_index('split')
    assert 0 < co.loc['iid', 'harmful'] < co.loc['iid', 'events'], co      # outcome labels: counterparts may stay SAFE
    assert (res / 'training_curve.csv').exists() and (res / 'online.csv').exists()


def test_memgym_gate_construction_labels_are_the_repository_rule(runs):
    "label_source: construction (the repository's rule): exactly the originals are SAFE, every counterpart HARMFUL."
    _, res, _ = runs['memgym-gate-construction-labels']
    co = pd.read_csv(res / 'corpus.csv')
    assert (co['events'] - co['harmful'] == co['originals']).all() and (co['harmful'] == co['counterparts']).all(), co
