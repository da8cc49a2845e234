"""Import cost (issues 24, 25): CPU seconds of `import memlab.runner` and of every `memlab` command on a small offline
store this script creates (6 rollouts), each in a fresh child process (user + system time from `resource.getrusage`),
the best of `repeats`; and which heavy packages each one imported. Target on a quiet machine: under 1 s each.
Usage: python tests/benchmarks/bench_import.py [repeats]"""
import resource, subprocess, sys, tempfile
from pathlib import Path

import yaml

repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
HEAVY = ('nltk', 'sklearn', 'scipy.stats', 'wordfreq', 'memlab.protocols')
PROBE = ('import atexit, sys\n'
         'atexit.register(lambda: print("imported:", sorted({h for h in %r for m in sys.modules if m == h or m.startswith(h + ".")}), file=sys.stderr))\n'
         % (HEAVY,))
CLI = PROBE + 'from memlab.cli import main\nsys.argv[0] = "memlab"\nmain()\n'


def cpu(args: list, ok=(0,)) -> tuple[float, str]:
    "CPU seconds (user + system) of one child process running `args`, and the heavy packages it imported."
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(args, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in ok: raise SystemExit(f'{args[2:]} failed ({r.returncode}): {r.stderr[-2000:]}')
    used = [ln for ln in r.stderr.splitlines() if ln.startswith('imported:')]
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), used[-1] if used else ''


def best(name: str, args: list, ok=(0,)):
    runs = [cpu(args, ok) for _ in range(repeats)]
    print(f'{name:>28}: {min(t for t, _ in runs):5.2f} s CPU (best of {repeats}; all: {", ".join(f"{t:.2f}" for t, _ in runs)})  {runs[-1][1]}')


with tempfile.TemporaryDirectory() as d:
    cfg = dict(name='bench-import', section='bench', dataset={'kind': 'synthetic', 'params': {'n_instances': 2, 'queries_per_instance': 3, 'n_filler': 5}},
               policies=[{'name': 'offline-reader', 'tier': 'strong'}], memories=[{'name': 'bm25', 'k': 12}])
    (Path(d) / 'c.yaml').write_text(yaml.safe_dump(cfg))
    store = str(Path(d) / 's')
    t, used = cpu([sys.executable, '-c', CLI, 'run', str(Path(d) / 'c.yaml'), '--store', store, '--score'])
    print(f'{"memlab run --score (setup)":>28}: {t:5.2f} s CPU  {used}')
    best('import memlab.runner', [sys.executable, '-c', PROBE + 'import memlab.runner'])
    best('memlab --version', [sys.executable, '-c', CLI, '--version'])
    memlab = lambda *a: [sys.executable, '-c', CLI, *a]
    best('memlab --help', memlab('--help'))
    best('memlab report STORE', memlab('report', store))
    best('memlab report NO-SUCH-STORE', memlab('report', store + '-missing'), ok=(2,))
    best('memlab report --retrieval', memlab('report', store, '--retrieval'))
    best('memlab show STORE', memlab('show', store))
    best('memlab check STORE', memlab('check', store))
    best('memlab score STORE (judged)', memlab('score', store))
    best('memlab resume --store STORE', memlab('resume', '--store', store))
    best('memlab estimate CONFIG', memlab('estimate', str(Path(d) / 'c.yaml')))
    best('memlab data inspect locomo', memlab('data', 'inspect', 'locomo', str(Path(__file__).parents[1] / 'fixtures' / 'locomo10.json')))
    fx = Path(__file__).parents[1] / 'fixtures' / 'longmemeval_oracle.json'
    import json
    (Path(d) / 'hyp.jsonl').write_text(''.join(json.dumps({'question_id': r['question_id'], 'hypothesis': 'I do not know'}) + '\n'
                                               for r in json.loads(fx.read_text())))
    best('memlab score-hypotheses', memlab('score-hypotheses', 'longmemeval', str(fx), str(Path(d) / 'hyp.jsonl'), '--judge', 'offline-match'))
    best('memlab export-inspect', memlab('export-inspect', store, str(Path(d) / 'logs')), ok=(0, 1))   # 1: the optional extra is missing; importing inspect_ai alone takes ~1.7 s
