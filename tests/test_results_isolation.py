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
