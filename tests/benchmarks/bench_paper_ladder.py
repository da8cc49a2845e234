"""Seed 000's grid at paper size: wall time, rollouts/s per memory interface and peak memory (issue 29).

    .venv/bin/python tests/benchmarks/bench_paper_ladder.py [--queries 500] [--memories bm25 items ppr-graph entity-graph]
        [--tier medium] [--executor serial|processes] [--workers 2] [--code DIR]

Prints figures only (this is not a timed test). The grid is `nbs/sections/scale_ladder.paper.yaml`'s (500 queries x 5
scales, N_irr 0..400, sessions of 135 synthetic turns: about 1M tokens per query at s4) with ONE offline tier (the
section's preset has two; a second tier adds only its loops: the memory of a (query, scale) is built once for all
agents). Each memory interface runs as its own run in a fresh Python process (so its time includes extracting or
analysing every pool session it meets, and its peak memory is its own), through `memlab.runner.run` exactly as the
section notebook does, into a scratch store that is deleted afterwards. Peak memory is the largest summed RSS of that
process and its workers, sampled every 0.2 s (psutil).

`--code DIR` runs another checkout of memlab (e.g. `git worktree add /tmp/base <commit>`) for a before/after figure on
the same grid: the baseline of issue 29 is the code before it on `--queries 20`.
"""
import argparse, json, os, subprocess, sys, tempfile, threading, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import json, os, sys, time, shutil, tempfile
a = json.loads(sys.argv[1])
if a['code']:     # another checkout: ahead of the editable install's finder, which outranks PYTHONPATH
    sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__name__', type(f).__name__).lower()]
    sys.path.insert(0, a['code'])
t0 = time.perf_counter()
from memlab.protocols.scale.section import ladder_data, ladder_config
from memlab.runner import run
from memlab.sections import policy_specs
from memlab.cli import make_executor
d = ladder_data('synthetic', None, None, a['queries'], a['pool_size'], a['session_turns'], a['ladder'], a['seed'])
t_data = time.perf_counter() - t0
cfg = ladder_config(d, policy_specs('offline', [a['tier']], []), [a['memory']], a['k'], {'name': 'offline-match'}, 10, a['seed'], 'bench')
store = tempfile.mkdtemp(prefix='bench-paper-')
ex, close = make_executor(a['executor'], a['workers'])
t1 = time.perf_counter()
try: st = run(cfg, d.instances, store, history=d.history, executor=ex, progress=False)
finally: close()
t_run = time.perf_counter() - t1
ro = st.rollouts(columns=['error'])
import memlab; print(json.dumps(dict(code=memlab.__file__, rollouts=len(ro), errors=int(ro['error'].notna().sum()), data_s=t_data, run_s=t_run)))
shutil.rmtree(store)
'''

def peak_rss(proc, out):
    "Largest summed RSS (bytes) of `proc` and its descendants, sampled until it exits."
    import psutil
    p, best = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            tree = [p, *p.children(recursive=True)]
            best = max(best, sum(c.memory_info().rss for c in tree if c.is_running()))
        except psutil.Error: pass
        time.sleep(0.2)
    out.append(best)

def one(memory, a, preset):
    args = dict(preset, memory=memory, tier=a.tier, queries=a.queries, executor=a.executor, workers=a.workers, code=a.code)
    env = dict(os.environ, MEMLAB_PROGRESS='0')
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, '-c', CHILD, json.dumps(args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tempfile.gettempdir())
    peak = []; th = threading.Thread(target=peak_rss, args=(proc, peak)); th.start()
    out, err = proc.communicate(); th.join()
    if proc.returncode: sys.exit(f'{memory}: the run failed (rc {proc.returncode}):\n{err[-3000:]}')
    r = json.loads(out.strip().splitlines()[-1])
    return dict(r, memory=memory, wall_s=time.perf_counter() - t, peak_gb=peak[0] / 2**30)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--preset', default=str(ROOT / 'nbs/sections/scale_ladder.paper.yaml'))
    ap.add_argument('--queries', type=int, default=None, help="default: the preset's n_queries (500)")
    ap.add_argument('--memories', nargs='+', default=None, help="default: the preset's memories")
    ap.add_argument('--tier', default='medium', help='the one offline reader tier')
    ap.add_argument('--executor', default='serial', choices=['serial', 'processes'])
    ap.add_argument('--workers', type=int, default=2)
    ap.add_argument('--code', default=None, help='a memlab checkout to run instead of this one (baseline)')
    a = ap.parse_args()
    import yaml
    p = yaml.safe_load(open(a.preset))
    a.queries = a.queries or p['n_queries']
    preset = dict(pool_size=p['pool_size'], session_turns=p['session_turns'], ladder=p['ladder'], k=p['k'], seed=p['seed'])
    mems = a.memories or p['memories']
    code = a.code or str(ROOT)
    rev = subprocess.run(['git', '-C', code, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()
    print(f'code {code} ({rev or "no git"}); {a.queries} queries x {len(p["ladder"])} scales (N_irr {p["ladder"]}), '
          f'{p["session_turns"]}-turn sessions, pool {p["pool_size"]}; tier {a.tier}; executor {a.executor}'
          + (f' x {a.workers}' if a.executor != 'serial' else '') + f'; load {os.getloadavg()[0]:.2f} at start', flush=True)
    rows, t = [], time.perf_counter()
    for m in mems:
        r = one(m, a, preset); rows.append(r)
        if Path(r['code']).parents[1] != Path(code).resolve(): sys.exit(f'{m}: ran memlab from {r["code"]}, not from {code}')
        print(f'{m:>13}: {r["rollouts"]:5d} rollouts ({r["errors"]} errors) in {r["run_s"]:7.1f} s = {r["rollouts"] / r["run_s"]:6.2f} '
              f'rollouts/s; data {r["data_s"]:.1f} s; process {r["wall_s"]:.1f} s; peak RSS {r["peak_gb"]:.2f} GB', flush=True)
    total = time.perf_counter() - t
    print(f'whole grid ({", ".join(mems)}): {sum(r["rollouts"] for r in rows)} rollouts in {total:.0f} s ({total / 60:.1f} min); '
          f'largest peak RSS {max(r["peak_gb"] for r in rows):.2f} GB; load {os.getloadavg()[0]:.2f} at the end')

if __name__ == '__main__': main()
