"""Every section notebook's parameters are what papermill sees: `papermill --help-notebook` (and a researcher's
`-p name value`) must list every name its `parameters` cell assigns. Papermill skips a line holding two '=' (a comment
such as `max_size = max(...)`), then warns "Passed unknown parameter" on every run that sets it."""
import ast, json
from pathlib import Path
import pytest
import papermill as pm

SECTIONS = sorted((Path(__file__).resolve().parents[1] / 'nbs' / 'sections').glob('*.ipynb'))


def assigned(nb: Path) -> list[str]:
    cell = next(c for c in json.loads(nb.read_text())['cells'] if 'parameters' in c['metadata'].get('tags', []))
    return [t.id for node in ast.parse(''.join(cell['source'])).body if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)]


@pytest.mark.parametrize('nb', SECTIONS, ids=lambda p: p.stem)
def test_papermill_sees_every_parameter(nb):
    names = assigned(nb)
    assert names, f'{nb.name}: no parameters cell'
    seen = pm.inspect_notebook(str(nb))
    assert [n for n in names if n not in seen] == [], f'{nb.name}: parameters papermill cannot see'
