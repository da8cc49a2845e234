"""Only `make reproduce` writes the committed results/ and figures/: a section notebook run at its defaults (papermill,
as JupyterLab's Run All would, without MEMLAB_OUT) writes under build/ and leaves the committed tree as it is."""
import os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]

def git_status(*paths) -> str:
    r = subprocess.run(['git', 'status', '--porcelain', '--', *paths], cwd=ROOT, capture_output=True, text=True)
    if r.returncode: pytest.skip(f'not a git checkout: {r.stderr.strip()}')
    return r.stdout

def test_section_notebook_at_defaults_leaves_committed_results_alone(tmp_path):
    before = git_status('results', 'figures')
    env = {k: v for k, v in os.environ.items() if k != 'MEMLAB_OUT'} | {'MEMLAB_PROGRESS': '0', 'MEMLAB_CACHE': str(tmp_path / 'c.sqlite')}
    nb = ROOT / 'nbs' / 'sections' / 'walkthrough.ipynb'
    r = subprocess.run([sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(nb.parent), str(nb), str(tmp_path / 'out.ipynb'),
                        '--log-level', 'WARNING'], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert git_status('results', 'figures') == before, 'a default notebook run changed the committed results/ or figures/'
    assert (ROOT / 'build' / 'results' / 'walkthrough' / 'accuracy.csv').exists()


def test_changed_parameter_starts_a_new_run_instead_of_failing(tmp_path):
    "The default run name carries the config hash: a second run with another parameter (same out_root) is a new store."
    env = os.environ | {'MEMLAB_PROGRESS': '0', 'MEMLAB_CACHE': str(tmp_path / 'c.sqlite')}
    nb = ROOT / 'nbs' / 'sections' / 'walkthrough.ipynb'
    def go(*params):
        args = [a for k, v in (('out_root', str(tmp_path / 'out')), ('n_instances', '2'), ('queries_per_instance', '3'),
                               ('n_resamples', '50'), *params) for a in ('-p', k, v)]
        return subprocess.run([sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(nb.parent), str(nb),
                               str(tmp_path / 'o.ipynb'), *args, '--log-level', 'WARNING'], env=env, capture_output=True, text=True, timeout=600)
    assert go().returncode == 0
    r = go(('n_filler', '12')); assert r.returncode == 0, r.stderr[-3000:]          # before: 'holds run ... another config hash'
    r = go(('n_filler', '12'), ('run_name', 'mine')); assert r.returncode == 0, r.stderr[-3000:]
    r = go(('n_filler', '13'), ('run_name', 'mine'))                                # a name the user chose: the error says what to change
    assert r.returncode != 0 and 'changed: dataset' in r.stderr and '`run_name` in a section notebook' in r.stderr, r.stderr[-2000:]
    runs = sorted(p.name for p in (tmp_path / 'out' / 'results' / 'walkthrough' / 'runs').iterdir())
    assert len(runs) == 3 and 'mine' in runs and all(r.startswith('walkthrough-') for r in runs if r != 'mine'), runs
