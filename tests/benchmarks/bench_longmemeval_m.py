"""LongMemEval_M at full size (issue 29, third item): figures only, no assertions.

Generates (or reuses) a LongMemEval_M-sized file in the released layout (`make_longmemeval_m.py`), then runs each
step in its own process and prints its seconds and peak RSS: `load_longmemeval`, `memlab data inspect longmemeval`,
and the scale ladder's `ladder_data('longmemeval', path, None, n_queries=20)` followed by Table 4.

    .venv/bin/python tests/benchmarks/bench_longmemeval_m.py [--file /tmp/lme_m/longmemeval_m_cleaned.json] [--records 500]
"""
from __future__ import annotations
import argparse, json, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

STEPS = {
    'load_longmemeval': """
from memlab.data import load_longmemeval
insts = load_longmemeval(PATH)
out = {'records': len(insts), 'sessions': sum(len(i.sessions) for i in insts)}
""",
    'memlab data inspect': """
import subprocess, sys, resource
r = subprocess.run([str(Path(sys.executable).with_name('memlab')), 'data', 'inspect', 'longmemeval', PATH], capture_output=True, text=True)
lines = r.stdout.splitlines()
out = {'exit': r.returncode, 'child_peak_rss_gb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
       'tokens': next((l.split()[-1] for l in lines if ' tokens ' in f' {l} ' and 'total' in l), None), 'stderr': r.stderr[-300:]}
""",
    'ladder_data + table4': """
import time
from memlab.protocols.scale.section import ladder_data, data_summary
from memlab.protocols.scale.ladder import table4
t = time.perf_counter()
data = ladder_data('longmemeval', PATH, None, n_queries=20)
t_data = time.perf_counter() - t
t4 = table4(data.instances, data.history)
out = {'ladder_data_s': round(t_data, 1), 'table4_s': round(time.perf_counter() - t - t_data, 1), 'summary': data_summary(data),
       'table4': t4[['scale', 'N_irr', 'sessions/query', 'tokens']].to_dict('records')}
""",
}

PRELUDE = """
import json, resource, sys, time
from pathlib import Path
PATH = sys.argv[1]
t0 = time.perf_counter()
"""
CODA = """
out['seconds'] = round(time.perf_counter() - t0, 1)
out['peak_rss_gb'] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
print(json.dumps(out))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--file', type=Path, default=Path('/tmp/lme_m/longmemeval_m_cleaned.json'))
    ap.add_argument('--records', type=int, default=500, help='records of a file generated anew')
    ap.add_argument('--steps', nargs='*', default=list(STEPS))
    a = ap.parse_args(argv)
    if not a.file.exists():
        subprocess.run([PY, str(Path(__file__).with_name('make_longmemeval_m.py')), '--out', str(a.file), '--records', str(a.records)], check=True)
    print(f'{a.file}: {a.file.stat().st_size:,} bytes')
    for name in a.steps:
        t = time.perf_counter()
        r = subprocess.run([PY, '-c', PRELUDE + STEPS[name] + CODA, str(a.file)], capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t
        res = json.loads(r.stdout.splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else {'exit': r.returncode, 'stderr': r.stderr[-500:]}
        print(f'{name}: {wall:.1f} s wall; ' + json.dumps(res))


if __name__ == '__main__': main()
