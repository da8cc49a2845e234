"""Issue 25, item 5: tables a paper can use. Floats are written with 10 significant digits in every column (a float in
a column that also holds None or text was written with 17), each section table is written as CSV and as LaTeX, and the
label of a data-only table is the one passed, in both files."""
from pathlib import Path

import pandas as pd
import pytest

from memlab.tables import save_table, latex_table
from memlab.sections import TableSaver


def mixed_frame():
    "SubtleMemory's calibration table: a CI bound is None for a small cell, so the column has object dtype."
    return pd.DataFrame({'value': ['overall', 'contradictory'], 'acc': pd.Series([0.48469696969697107, 0.0], dtype=object),
                         'lo': pd.Series([0.36363636363636365, None], dtype=object), 'n': [33, 6]})


def test_object_columns_get_ten_significant_digits(tmp_path):
    p = save_table(mixed_frame(), tmp_path / 't.csv', ['offline reader (no LLM)'])
    rows = p.read_text().splitlines()
    assert rows[1] == 'overall,0.4846969697,0.3636363636,33,offline reader (no LLM)', rows
    assert rows[2] == 'contradictory,0,,6,offline reader (no LLM)', rows


def test_section_tables_are_csv_and_latex_with_the_label_passed(tmp_path):
    save = TableSaver(tmp_path / 'memtrace', ['offline reader (no LLM)'])
    save(pd.DataFrame({'kp_group': ['a_1'], 'n_kps': [4], 'share': [0.25]}), 'table2_kps', ['data only (no policy): knowledge points'])
    save(pd.DataFrame({'memory': ['bm25'], 'acc': [2 / 3]}), 'accuracy')
    csv = pd.read_csv(tmp_path / 'memtrace' / 'table2_kps.csv')
    tex = (tmp_path / 'memtrace' / 'table2_kps.tex').read_text()
    assert csv['label'].tolist() == ['data only (no policy): knowledge points']
    assert r'\caption{memtrace: table2\_kps (data only (no policy): knowledge points)}' in tex and 'offline reader' not in tex, tex
    assert r'kp\_group & n\_kps & share \\' in tex and r'a\_1 & 4 & 0.25 \\' in tex, tex
    acc = (tmp_path / 'memtrace' / 'accuracy.tex').read_text()
    assert r'\caption{memtrace: accuracy (offline reader (no LLM))}' in acc and r'bm25 & 0.6667 \\' in acc, acc
    assert sorted(p.name for p in (tmp_path / 'memtrace').iterdir()) == ['accuracy.csv', 'accuracy.tex', 'table2_kps.csv', 'table2_kps.tex']


def test_latex_headers_show_units_and_escape():
    tex = latex_table(pd.DataFrame({'p_90%': [0.5], 'latency_s': [1.0], 'delta_pp': [-3.5], 'input_tokens': [1200]}), 'c', 'tab:c')
    assert r'p\_90\% & latency (s) & delta (pp) & input (tokens) \\' in tex, tex


def test_latex_imports_styler_lazily():
    import subprocess, sys
    code = 'import sys, memlab.tables, memlab.sections; print(any(m.startswith("jinja2") for m in sys.modules))'
    assert subprocess.run([sys.executable, '-c', code], capture_output=True, text=True).stdout.strip() == 'False'


@pytest.fixture(scope='module')
def store(tmp_path_factory):
    from inproc import memlab_main
    from small_store import small_config
    tmp = tmp_path_factory.mktemp('latex')
    assert memlab_main(['run', small_config(tmp, 'tex'), '--store', tmp / 's', '--score'])['rc'] == 0
    return tmp / 's'


def test_report_latex_through_the_cli(store, tmp_path):
    "`memlab report --latex`: one LaTeX table, counts of unparsed verdicts and judge errors as columns, other lines as comments."
    import shutil
    from inproc import memlab_main
    from memlab.core import Score
    from memlab.runner import ResultsStore
    s = tmp_path / 's'; shutil.copytree(store, s)
    st = ResultsStore(s); sc = st.scores()
    st.write_scores([Score(rollout_id=r, judge='offline-match', judge_model='offline', prompt_hash=sc['prompt_hash'].iloc[0], run=1,
                           label='unparsed', correct=None, raw='?') for r in sc['rollout_id'].iloc[:2]])
    r = memlab_main(['report', s, '--latex'])
    lines = r['out'].splitlines()
    assert r['rc'] == 0 and r['out'].count(r'\begin{table}') == 1, r['out']
    assert all(l.startswith(('%', '\\')) or ' & ' in l or not l for l in lines), r['out']
    assert r'\caption{memlab report s: accuracy with task-level bootstrap CIs (offline reader (no LLM))}' in lines, r['out']
    head = next(l for l in lines if l.startswith('policy & '))
    assert head.endswith(r'errors & unparsed & judge\_errors \\'), head
    row = next(l for l in lines if l.startswith('offline-reader'))
    assert row.endswith(r'& 0 & 2 & 0 \\'), row
    assert memlab_main(['report', tmp_path / 'nothing', '--latex'])['rc'] == 2


def test_report_retrieval_latex(store):
    from inproc import memlab_main
    r = memlab_main(['report', store, '--retrieval', '--latex'])
    assert r['rc'] == 0 and r['out'].count(r'\begin{table}') == 2 and r'recall\_any@5' in r['out'], r['out']
