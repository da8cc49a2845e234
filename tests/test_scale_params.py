"""Bad parameters of the scale-ladder section fail before any work, in one line naming the parameter, and write nothing.

Each case runs the section notebook with papermill (as `make refresh-notebooks` does, `--cwd nbs/sections`) on the
small LongMemEval-format fixture that `test_scale_ladder_run.py` uses, with MEMLAB_OUT pointing at a fresh folder:
papermill must fail with the one-line ValueError and the folder must not exist afterwards (no run store, no tables,
no figures). The cases run once, concurrently, in a module fixture (each is a fresh kernel: a few seconds).
"""
import ast, os, re, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import papermill
import pytest

from memlab.protocols.scale.protocol import SCALE_PARAMS, check_params

ROOT = Path(__file__).resolve().parents[1]
NB = ROOT / 'nbs' / 'sections' / 'scale_ladder.ipynb'
FX = ROOT / 'tests' / 'fixtures' / 'longmemeval_s_cleaned.json'       # 5 questions
SMALL = ['-p', 'dataset', 'longmemeval', '-p', 'data_path', str(FX), '-p', 'n_resamples', '50',
         '-y', '{ladder: [0, 2, 4], memories: [bm25, items]}']          # a run of seconds if the check let it through

CASES = {   # name: (papermill arguments, the error line expected on stderr)
    'B0': (['-p', 'B0', '0'],
           r"ValueError: scale_ladder parameter 'B0': not a parameter of this section; .*budgets\['B0'\]"),
    'budgets_B0': (['-y', '{budgets: {B0: 0, B1: 3, B2: 5}}'],
                   r"ValueError: scale_ladder parameter budgets\['B0'\]: must be an integer >= 1, got 0"),
    'n_queries_0': (['-p', 'n_queries', '0'],
                    r"ValueError: scale_ladder parameter 'n_queries': must be an integer >= 1 or None \(all queries\), got 0"),
    'n_queries_too_many': (['-p', 'n_queries', '500'],
                           rf"ValueError: scale_ladder parameter 'n_queries': 500 queries asked, but {re.escape(str(FX))} holds 5"),
}

def _papermill(tmp: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, 'MEMLAB_OUT': str(tmp / 'out'), 'MEMLAB_PROGRESS': '0'}
    return subprocess.run([sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(NB.parent), str(NB),
                           str(tmp / 'nb.ipynb'), *SMALL, *args], env=env, capture_output=True, text=True, timeout=600)

@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    dirs = {name: tmp_path_factory.mktemp(name) for name in CASES}
    with ThreadPoolExecutor(2) as ex:
        procs = dict(zip(CASES, ex.map(lambda n: _papermill(dirs[n], CASES[n][0]), CASES)))
    return {n: (procs[n], dirs[n]) for n in CASES}

@pytest.mark.parametrize('name', list(CASES))
def test_bad_parameter_fails_first_and_writes_nothing(runs, name):
    p, tmp = runs[name]
    assert p.returncode != 0, f'papermill succeeded with {CASES[name][0]}'
    lines = [l for l in p.stderr.splitlines() if l.startswith('ValueError: scale_ladder')]
    assert lines and re.fullmatch(CASES[name][1] + '.*', lines[-1]), p.stderr[-3000:]
    out = tmp / 'out'
    assert not out.exists(), f'written under MEMLAB_OUT: {sorted(map(str, out.rglob("*")))}'

def test_defaults_are_the_parameters_cell():
    "SCALE_PARAMS is the section's parameters cell: same names, same defaults, and they pass the check."
    cell = papermill.inspect_notebook(str(NB))
    assert list(cell) == list(SCALE_PARAMS)
    assert {n: ast.literal_eval(v['default']) for n, v in cell.items()} == SCALE_PARAMS
    check_params(**SCALE_PARAMS)
