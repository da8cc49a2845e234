"""Issue 24, import cost: `import memlab.runner` and the CLI import neither nltk's package (scipy.stats, scikit-learn
come with it) nor any protocol package unless a command needs one. Counts of imported modules, never seconds
(tests/benchmarks/bench_import.py prints the CPU time)."""
import subprocess, sys
from pathlib import Path

import pytest
import yaml

HEAVY = ('nltk', 'sklearn', 'scipy.stats', 'memlab.protocols')
PROBE = ('import atexit, sys\n'
         'atexit.register(lambda: print("imported:", sorted({h for h in %r for m in sys.modules if m == h or m.startswith(h + ".")})))\n'
         % (HEAVY,))
CLI = PROBE + 'from memlab.cli import main\nmain()\n'

def imported(*args) -> list:
    "The HEAVY packages a fresh process running `python -c PROBE+CODE args...` imported."
    r = subprocess.run([sys.executable, '-c', *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return eval(r.stdout.strip().splitlines()[-1].removeprefix('imported:'))

def test_import_runner_imports_no_nltk_and_no_protocol():
    assert imported(PROBE + 'import memlab.runner') == []

def test_import_runner_imports_no_scipy_nor_tenacity():
    "scipy.sparse is imported by the entity graph when it builds one, tenacity by a backend when it calls: not by import memlab.runner."
    probe = 'import sys\nimport memlab.runner\nprint(sorted(m for m in sys.modules if m.split(".")[0] in ("scipy", "tenacity")))'
    r = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == '[]', (r.stdout[-500:], r.stderr[-2000:])

def test_stemming_imports_no_nltk_package():
    assert imported(PROBE + 'from memlab.memory import terms; assert terms("running days") == ["run", "day"]') == []

def test_version_imports_nothing_heavy():
    assert imported(CLI, '--version') == []

@pytest.fixture(scope='module')
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('cost')
    cfg = dict(name='cost', section='cost', dataset={'kind': 'synthetic', 'params': {'n_instances': 2, 'queries_per_instance': 3, 'n_filler': 5}},
               policies=[{'name': 'offline-reader', 'tier': 'strong'}], memories=[{'name': 'bm25', 'k': 12}])
    (tmp / 'c.yaml').write_text(yaml.safe_dump(cfg))
    imported(CLI, 'run', str(tmp / 'c.yaml'), '--store', str(tmp / 's'), '--score')
    return tmp / 's'

def test_report_of_a_harness_only_store_imports_no_protocol(store):
    assert imported(CLI, 'report', str(store)) == []

def test_a_protocol_name_loads_its_package():
    "A lookup of a protocol's dataset kind imports its package: lazy, not missing."
    got = imported(PROBE + 'from memlab.config import DATASETS\nassert "memgym-dr" in DATASETS')
    assert 'memlab.protocols' in got
