"""The paper style of `memlab.plots` and the walkthrough, scale-ladder and MemTrace figures (issue 25, part 4).

`layout_problems` must find overlapping text and text outside the canvas (matplotlib's own bounding boxes) and nothing in
a clean figure. Every figure function of the three sections, drawn from small real inputs (a small offline scale-ladder
run through the protocol functions, and the sections' committed result CSVs), has no layout problem, is one or two
columns wide (3.5 or 7 in) and saves as a vector PDF beside a 300-dpi PNG with MEMLAB_FIGURE_CHECK=1.
"""
from pathlib import Path
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from memlab.plots import layout_problems, save_figure, paper_figure, label_figure, figure_legend, series_style

ROOT = Path(__file__).resolve().parents[1]
LABELS = ['offline reader (no LLM)']


def check_figure(fig, path: Path, monkeypatch) -> list:
    "The figure's layout problems; it must be one or two columns wide and save as PDF + 300-dpi PNG under the check."
    problems = layout_problems(fig)
    assert fig.get_figwidth() in (3.5, 7.0), fig.get_figwidth()
    monkeypatch.setenv('MEMLAB_FIGURE_CHECK', '1')
    if not problems:
        png = save_figure(fig, path)
        from PIL import Image
        assert png.exists() and Image.open(png).size[0] == round(300 * fig.get_figwidth())
        assert png.with_suffix('.pdf').read_bytes()[:5] == b'%PDF-'
    plt.close('all')
    return problems


def test_layout_problems_finds_overlap_and_text_off_the_canvas(tmp_path, monkeypatch):
    "Two texts on top of each other, crowded tick labels and a text past the edge are reported; save_figure refuses them."
    fig, (ax,) = paper_figure(1, 'single')
    ax.set_xticks(range(10), [f'a long tick label {i}' for i in range(10)])
    fig.text(0.5, 0.5, 'first note'); fig.text(0.5, 0.5, 'second note'); fig.text(0.9, 0.9, 'runs past the right edge')
    problems = layout_problems(fig)
    assert any("'first note'" in p and "'second note'" in p for p in problems), problems
    assert any('x tick label' in p and p.startswith('overlap') for p in problems), problems
    assert any(p.startswith('outside the canvas') and 'right edge' in p for p in problems), problems
    monkeypatch.setenv('MEMLAB_FIGURE_CHECK', '1')
    with pytest.raises(ValueError, match='layout problems'):
        save_figure(fig, tmp_path / 'bad.png')
    assert not (tmp_path / 'bad.png').exists() and not (tmp_path / 'bad.pdf').exists()


def test_a_clean_figure_has_no_layout_problem(tmp_path, monkeypatch):
    "Panels, a figure legend, a wrapped title and a long policy footnote: nothing overlaps, everything on the canvas."
    fig, axes = paper_figure(3, 'double')
    for ax in axes:
        for m in ('bm25', 'long-context', 'items'):
            ax.plot([1, 2, 3], [1, 3, 2], label=m, **series_style(m))
        ax.set_xlabel('budget B (memory calls)'); ax.set_ylabel('Pass@B (%)'); ax.set_title('panel')
    figure_legend(fig)
    label_figure(fig, LABELS + ['a second, long policy label that has to wrap over more than one line ' * 2], 'a clean figure')
    assert check_figure(fig, tmp_path / 'clean.png', monkeypatch) == []


@pytest.fixture(scope='module')
def ladder(tmp_path_factory):
    "A small offline scale-ladder run (3 rungs, 2 interfaces, 2 tiers) through the section's protocol functions."
    from memlab.sections import policy_specs, judge_spec_for
    from memlab.protocols.scale.section import ladder_data, ladder_config, run_ladder, reliability, budget_tables
    from memlab.protocols.scale.protocol import end_names
    data = ladder_data('synthetic', None, None, 8, 12, 4, [0, 6, 12], 0)
    judge = judge_spec_for(None)
    cfg = ladder_config(data, policy_specs('offline', ['strong', 'weak'], []), ['bm25', 'items'], 6, judge, 10, 0, 'figs')
    store, _, df = run_ladder(cfg, data, tmp_path_factory.mktemp('ladder') / 'runs', judge, progress=False)
    df = df.merge(store.rollouts()[['rollout_id', 'trajectory']], on='rollout_id', how='left')   # as the section passes it
    diag, t1 = reliability(df, 2, n_resamples=50)
    curve, _ = budget_tables(df, {'B0': 2, 'B1': 3}, n_resamples=50)
    return df, diag, t1, curve, end_names(t1)[1]


def scale_figures(diag, t1, curve, labels, s_hi, frame=None) -> dict:
    "Seed 000's Figures 2, 3, 5 and 11 from the scale ladder's tables (B = 2, alpha = 0.7)."
    from memlab.protocols.scale.figures import fig2_reliability, fig3_decomposition, fig5_endpoints, fig11_budgets
    return {'fig2': fig2_reliability(diag, labels, 0.7), 'fig3': fig3_decomposition(diag, labels, s_hi),
            'fig5': fig5_endpoints(t1, diag, labels, 2), 'fig11': fig11_budgets(curve, labels, s_hi, frame=frame)}


def test_scale_ladder_figures_on_a_small_run(ladder, tmp_path, monkeypatch):
    "Figures 2, 3, 5 and 11 (with the q0/q1 cost-accounting panel) of a small offline run: clean, column-wide, saved."
    df, diag, t1, curve, s_hi = ladder
    figs = scale_figures(diag, t1, curve, sorted(df['policy_label'].unique()), s_hi, frame=df)
    legend = [t.get_text() for t in figs['fig2'].legends[0].get_texts()]
    assert legend[:2] == ['offline reader, weak tier', 'offline reader, strong tier'] and legend[2].startswith('α = 0.7')
    cost = figs['fig11'].axes[-1]
    assert cost.get_xlabel() == 'q1 evidence tokens / rollout' and all(p.get_width() > 0 for p in cost.patches)
    for name, fig in figs.items():
        assert check_figure(fig, tmp_path / f'{name}.png', monkeypatch) == [], name


def test_scale_ladder_figures_on_the_full_run_tables(tmp_path, monkeypatch):
    "The committed full run (3 tiers x 6 interfaces x 5 rungs): 18 cells still fit without overlapping text."
    res = ROOT / 'results' / 'scale_ladder'
    diag, t1, curve = (pd.read_csv(res / f'{n}.csv') for n in ('diagnostics', 'table1', 'budget_curve'))
    figs = scale_figures(diag, t1, curve, LABELS, 's4')
    assert [t.get_text() for t in figs['fig3'].axes[0].get_yticklabels()] == ['weak tier', 'medium tier', 'strong tier']
    for name, fig in figs.items():
        assert check_figure(fig, tmp_path / f'{name}.png', monkeypatch) == [], name


def test_memtrace_figures_on_the_run_tables(tmp_path, monkeypatch):
    "Figures 3, 4 and 5 of MemTrace from its committed tables (12 systems): W1..W8, readable names, clean layout."
    from memlab.protocols.memtrace.figures import fig3_retention, fig4_conditions, fig5_oracle
    res = ROOT / 'results' / 'memtrace'
    trace, t4, t5 = (pd.read_csv(res / f'{n}.csv') for n in ('retention_trace', 'table4_conditions', 'table5_oracle'))
    figs = {'fig3': fig3_retention(trace, pd.DataFrame({'system': trace['system'].unique()}), LABELS, 8),
            'fig4': fig4_conditions(t4, LABELS), 'fig5': fig5_oracle(t5, LABELS)}
    assert [t.get_text() for t in figs['fig3'].axes[0].get_xticklabels()] == [f'W{i}' for i in range(1, 9)]
    names = [t.get_text() for t in figs['fig4'].axes[0].get_yticklabels()]
    assert names and not any('[' in n for n in names), names          # no raw specs
    for name, fig in figs.items():
        assert check_figure(fig, tmp_path / f'{name}.png', monkeypatch) == [], name


def test_walkthrough_figure_on_the_run_table(tmp_path, monkeypatch):
    "The walkthrough's accuracy-by-type figure from its committed table: readable legend, % axis, clean layout."
    from memlab.plots import fig_accuracy_by_type
    bt = pd.read_csv(ROOT / 'results' / 'walkthrough' / 'accuracy_by_type.csv')
    fig = fig_accuracy_by_type(bt, LABELS, 'Walkthrough: accuracy by question type (95% task-level CI, medium tier)')
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend and not any('[' in t for t in legend), legend
    assert fig.axes[0].yaxis.get_major_formatter().format_ticks([50]) == ['50%']
    assert check_figure(fig, tmp_path / 'accuracy_by_type.png', monkeypatch) == []
