"""Run a section notebook under papermill with -p / -y parameters (shared by the section tests)."""
import json, subprocess, sys
from pathlib import Path

SECTIONS = Path(__file__).resolve().parents[1] / 'nbs' / 'sections'


def papermill_section(section: str, out_nb: Path, env: dict, *params, timeout: int=600) -> subprocess.CompletedProcess:
    "Execute nbs/sections/<section>.ipynb into out_nb; strings pass as -p, anything else as YAML through -y."
    args = [sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(SECTIONS), str(SECTIONS / f'{section}.ipynb'), str(out_nb)]
    for k, v in params: args += ['-p', k, v] if isinstance(v, str) else ['-y', f'{k}: {json.dumps(v)}']
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
