"""The figures of MemoryAgentBench, SubtleMemory and MemGym (issue 25, part 4) and MemoryAgentBench's table units (part 5).

Each figure is drawn from small real inputs (the protocol functions on small configurations, or the benchmark's committed
CSV), then checked with `memlab.plots.layout_problems` (matplotlib's own text bounding boxes: no overlapping text, no
text outside the canvas), its width (3.5 or 7 in) and `save_figure` writing a PDF and a 300-dpi PNG with
MEMLAB_FIGURE_CHECK=1. MemoryAgentBench's tables hold fractions in [0, 1] like every other section's, and Table 2's
saved header names its index columns `reader` and `agent` (not `reader / `).
"""
from pathlib import Path
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from memlab.plots import layout_problems, save_figure

ROOT = Path(__file__).resolve().parents[1]


from test_figures import check_figure   # one check for every figure: layout, width, PDF + 300-dpi PNG


@pytest.fixture(scope='module')
def mab(tmp_path_factory):
    "A small MemoryAgentBench section: the main grid, the chunk-size and top-k grids, offline."
    from memlab.protocols.mab.section import MABSection
    sec = MABSection(families=['ruler_qa1', 'factconsolidation_sh'], agents=['long-context', 'bm25', 'dense', 'items'],
                     context_tokens=2000, questions_per_context=10, ablation_families=['ruler_qa1', 'factconsolidation_sh'],
                     chunk_sizes=[512, 4096], topk_ablation=[2, 5], n_resamples=50,
                     out_root=str(tmp_path_factory.mktemp('mab')))
    insts, spec = sec.data()
    main, _ = sec.run_main(insts, spec)
    chunk, topk = sec.chunk_size_runs(), sec.topk_runs()
    return sec, main, chunk, topk


def test_mab_tables_are_fractions_with_named_index_columns(mab):
    "Table 2, Tables 6-7 and the ablations hold fractions in [0, 1]; table2.csv's header starts reader,agent."
    from memlab.protocols.mab.report import table2, per_source, mark_best
    sec, main, chunk, topk = mab
    t2 = table2(main)
    assert ((t2 >= 0) & (t2 <= 1)).all().all() and (t2 > 0).any().any(), t2
    ps = per_source(main, n_resamples=50)
    ci = ps[['lo', 'hi']].stack().dropna()
    assert ps['mean'].between(0, 1).all() and len(ci) and ci.between(0, 1).all()
    for t in (sec.ablation_table(chunk, 'chunk_size'), sec.ablation_table(topk, 'k')):
        assert t['mean'].between(0, 1).all() and (t['mean'] > 0).any()
    sec.save(t2.reset_index(), 'table2'); sec.save(mark_best(t2).reset_index(), 'table2_marked')
    for name in ('table2', 'table2_marked'):
        header = (sec.results_dir / f'{name}.csv').read_text(encoding='utf-8').splitlines()[0].split(',')
        assert header[:2] == ['reader', 'agent'], header
        assert all(' / ' in h for h in header[2:-1]) and header[-1] == 'label', header
    assert float(pd.read_csv(sec.results_dir / 'table2.csv').iloc[:, 2:-1].max().max()) <= 1


def test_mab_fig2_fig3(mab, tmp_path, monkeypatch):
    "Figures 2 and 3 from the small section's ablations: double column, no layout problems, the paper's x100 axis."
    from memlab.protocols.mab.figures import fig2_chunk_size, fig3_topk
    sec, main, chunk, topk = mab
    f2 = sec.ablation_table(chunk[chunk['agent'] != 'long-context'], 'chunk_size')
    fig = fig2_chunk_size(f2, sec.labels)
    assert [a.get_ylabel() for a in fig.axes] == ['SubEM (x100)', 'SubEM (x100)']
    assert len({a.get_ylim() for a in fig.axes}) == 1
    for ax in fig.axes:   # every series drawn, at distinct x positions when the values coincide
        xs = [tuple(np.round(c.lines[0].get_xdata(), 6)) for c in ax.containers]
        assert len(xs) == 3 and len(set(xs)) == 3
    assert check_figure(fig, tmp_path / 'fig2_chunk_size.png', monkeypatch) == []
    fig = fig3_topk(sec.ablation_table(topk, 'k'), sec.labels)
    assert check_figure(fig, tmp_path / 'fig3_topk.png', monkeypatch) == []


def test_mab_construction_scaling(tmp_path, monkeypatch):
    "The construction-time figure from the benchmark's committed CSV: names the embedder timed and spells out M.C."
    from memlab.protocols.mab.figures import construction_scaling
    bench = pd.read_csv(ROOT / 'results' / 'memoryagentbench' / 'bench_construction.csv')
    fig = construction_scaling(bench, sorted(set(bench['label'])))
    title = fig._suptitle.get_text()
    assert 'memory construction (M.C.)' in title and 'hashed bag-of-words embedder' in title
    assert len(fig.axes[0].containers) == bench.loc[bench['section'] == 'scaling', 'agent'].nunique()
    assert check_figure(fig, tmp_path / 'construction_scaling.png', monkeypatch) == []


def test_subtle_fig3_waterfall(tmp_path, monkeypatch):
    "The waterfall with one relation that has no R_pres: no empty panel, CIs drawn as error bars, fonts >= 7 pt."
    from memlab.protocols.subtle.waterfall import synth_frame, waterfall
    from memlab.protocols.subtle.figures import fig3_waterfall
    wf = waterfall(synth_frame(answers=(('reader-weak', 'v2'), ('reader-strong', 'v2')), missing=3), n_resamples=200)
    gone = (wf['model'] == 'reader-weak') & (wf['scope'] == 'contradictory')
    wf.loc[gone, ['n_oracle', 'n_pres', 'n_ret']] = 0
    wf.loc[gone, ['r_pres', 'r_pres_lo', 'r_pres_hi', 'r_ret', 'r_ret_lo', 'r_ret_hi']] = np.nan
    fig = fig3_waterfall(wf, ['offline reader (no LLM)'])
    assert len(fig.axes) == 4 and all(len(a.patches) or len(a.containers) for a in fig.axes)
    assert fig.axes[0].get_title().startswith('reader-weak')                      # answer models in strength order
    from matplotlib.container import ErrorbarContainer
    bars = [c for a in fig.axes for c in a.containers if isinstance(c, ErrorbarContainer) and c.has_xerr]
    assert len(bars) == 2 * (3 + 4)       # R_pres and R_ret with CI bars per scope kept: 3 for the weak reader, 4 for the strong
    assert min(t.get_fontsize() for a in fig.axes for t in a.texts + a.get_yticklabels()) >= 7
    assert check_figure(fig, tmp_path / 'fig3_waterfall.png', monkeypatch) == []


def test_memgym_fig3_strategies(tmp_path, monkeypatch):
    "Figure 3 from seeded episodes, with three strategies at 0: each stays visible; panel (a) names its interval."
    from memlab.protocols.memgym.paired import synth_episodes, budget_table, hop_table
    from memlab.protocols.memgym.figures import fig3_strategies
    ep = synth_episodes(n_dr=300, n_codeqa=100, reasoners=('sonnet-4.5',), missing=5)
    bt, ht = budget_table(ep, n_resamples=200), hop_table(ep)
    zero = bt['strategy'].isin(['a-mem', 'lightmem', 'llm-summarizing'])
    bt.loc[zero, ['mean', 'lo', 'hi']] = 0.0
    ht.loc[ht['strategy'].isin(['a-mem', 'lightmem', 'memorybank']), ['mean', 'half']] = 0.0
    fig = fig3_strategies(bt, ht, ['synthetic episodes (no LLM)'])
    axa, axb = fig.axes
    assert 'bootstrap CI' in axa.get_title()
    zx = [c.lines[0].get_xdata()[0] for c in axa.containers if np.allclose(c.lines[0].get_ydata(), 0)]
    assert len(zx) == 3 and len(set(np.round(zx, 6))) == 3
    zm = [l for l in axb.lines if l.get_linestyle() == 'None' and np.allclose(l.get_ydata(), 0)]
    assert len(zm) == 3 and len({l.get_marker() for l in zm}) == 3
    assert check_figure(fig, tmp_path / 'fig3_strategies.png', monkeypatch) == []
