"""tests/run_nbdev_tests.py (what `make nbdev-test` runs): a failing notebook fails the run and is named, and every
notebook starts in a process no other notebook has touched (a registry entry made by one is not seen by the next)."""
import subprocess, sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / 'tests' / 'run_nbdev_tests.py'


def notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nbformat.write(nb, path)
    return path


def run(*nbs: Path, jobs: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUNNER), '-j', str(jobs), *map(str, nbs)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_a_failing_notebook_fails_the_run_and_is_named(tmp_path):
    good = notebook(tmp_path / 'good.ipynb', 'x = 1', 'assert x == 1')
    bad = notebook(tmp_path / 'bad.ipynb', 'x = 1', 'assert x == 2, "the check that must fail"')
    r = run(good, bad)
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'bad.ipynb' in r.stderr and 'good.ipynb' not in r.stderr.split('failed:')[-1], r.stderr
    assert '1 of 2 notebooks passed' in r.stdout, r.stdout
    assert run(good).returncode == 0


def test_each_notebook_starts_with_empty_registries(tmp_path):
    "One notebook registers a policy into memlab.agent.POLICIES; the next, run by the same single worker, must not see it."
    first = notebook(tmp_path / 'b_first.ipynb', 'from memlab.agent import POLICIES',
                     'POLICIES.setdefault("leaked-from-first", object())', 'assert "leaked-from-first" in POLICIES')
    second = notebook(tmp_path / 'a_second.ipynb', 'import sys', 'from memlab.agent import POLICIES',
                      'assert "leaked-from-first" not in POLICIES, "registry state leaked between notebooks"')
    big = first.read_text() + ' ' * 10_000                   # the runner starts with the largest: `first` runs first
    first.write_text(big)
    r = run(first, second)
    assert r.returncode == 0, r.stdout + r.stderr
    assert '2 of 2 notebooks passed' in r.stdout
