"""Copy section notebooks for nbval, numbering their code cells.

nbdev_clean (which CI requires) sets every execution_count to None, and nbval refuses a reference cell that
has outputs but no execution count ("Unrun reference cell has outputs"). The committed notebooks stay clean;
nbval checks numbered copies under build/, from where `project_root()` still finds settings.ini.
"""
import sys
from pathlib import Path
import nbformat

def main(dest: str, *notebooks: str):
    out = Path(dest); out.mkdir(parents=True, exist_ok=True)
    for p in map(Path, notebooks):
        nb = nbformat.read(p, as_version=4)
        n = 0
        for c in nb.cells:
            if c.cell_type == 'code':
                n += 1; c.execution_count = n
                for o in c.get('outputs', []):
                    if 'execution_count' in o: o['execution_count'] = n
        nbformat.write(nb, out / p.name)
        print(f'nbval copy: {out / p.name} ({n} code cells)')

if __name__ == '__main__': main(*sys.argv[1:])
