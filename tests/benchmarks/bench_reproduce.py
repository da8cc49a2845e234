"""`make reproduce`'s sections at their full sizes into a scratch root, timed per section and per cell (issue 29): prints
figures (this is not a timed test).

    .venv/bin/python tests/benchmarks/bench_reproduce.py [--out /tmp/rep29] [--profile DIR] [--small] [--set n_users=4] SECTION [SECTION ...]

Each section notebook's code cells run in one namespace, in order, as papermill runs them: the parameters cell, then a
'# Parameters' cell with the section's `nbs/sections/<name>.full.yaml` values (the defaults with --small), then the rest,
with MEMLAB_OUT set to the scratch root (never the project's results/ or figures/). Printed per section: the load average,
the wall seconds and this process's CPU seconds (a fairer figure on a shared machine), the seconds of each cell over 1 s; with --profile, cProfile's top functions by cumulative time
(DIR/<section>.prof keeps the whole profile). Compare the tables written under <out>/results/<section>/ with the
committed ones: `diff -r --exclude=runs --exclude='*.parquet' results/<section> <out>/results/<section>`.
"""
import argparse, cProfile, io, json, os, pstats, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cells(nb_path):
    "The notebook's code cells as (tags, source)."
    nb = json.loads(Path(nb_path).read_text())
    return [(c.get('metadata', {}).get('tags') or [], ''.join(c['source'])) for c in nb['cells'] if c['cell_type'] == 'code']


def injected(params):
    "papermill's injected cell for `params`."
    return '# Parameters\n' + ''.join(f'{k} = {v!r}\n' for k, v in params.items())


def run_section(name, out, small=False, profile=None, top=25, overrides=None):
    "Run section `name` at full size into `out`; returns (wall seconds, CPU seconds of this process, [(cell index, seconds, first line)])."
    import yaml
    nb = ROOT / 'nbs' / 'sections' / f'{name}.ipynb'
    params = {} if small else yaml.safe_load((ROOT / 'nbs' / 'sections' / f'{name}.full.yaml').read_text()) or {}
    params = {**params, **(overrides or {})}
    os.environ['MEMLAB_OUT'] = str(out); os.environ.setdefault('MEMLAB_PROGRESS', '0')
    cwd = os.getcwd(); os.chdir(nb.parent)
    srcs = []
    ns = {'__name__': '__main__', 'In': srcs}
    for tags, src in cells(nb):
        srcs.append(src)
        if 'parameters' in tags: srcs.append(injected(params))
    times, prof = [], cProfile.Profile() if profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        for i, src in enumerate(srcs):
            t = time.perf_counter()
            code = compile(src, f'<{name} cell {i}>', 'exec')
            if prof: prof.enable()
            try: exec(code, ns)
            finally:
                if prof: prof.disable()
            times.append((i, time.perf_counter() - t, src.strip().splitlines()[0][:90] if src.strip() else ''))
    finally: os.chdir(cwd)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if prof:
        Path(profile).mkdir(parents=True, exist_ok=True); prof.dump_stats(Path(profile) / f'{name}.prof')
        s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats('cumulative').print_stats(top); print(s.getvalue()[-12000:])
    return wall, cpu, times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('sections', nargs='+'); ap.add_argument('--out', default='/tmp/rep29')
    ap.add_argument('--profile', default=None); ap.add_argument('--small', action='store_true')
    ap.add_argument('--set', action='append', default=[], metavar='NAME=YAML', help='override a parameter, e.g. --set n_users=4')
    a = ap.parse_args()
    out = Path(a.out).resolve()
    if out in (ROOT, ROOT / 'results', ROOT / 'figures'): sys.exit('--out must be a scratch root, not the project')
    rows = []
    for name in a.sections:
        load = os.getloadavg()
        import yaml
        wall, cpu, times = run_section(name, out, a.small, a.profile, overrides={k: yaml.safe_load(v) for k, v in (x.split('=', 1) for x in a.set)})
        print(f'== {name}: {wall:.1f} s wall, {cpu:.1f} s CPU (load at start {load[0]:.2f} {load[1]:.2f}, at end {os.getloadavg()[0]:.2f})')
        for i, s, first in times:
            if s >= 1: print(f'   cell {i:2d} {s:8.1f} s  {first}')
        rows.append((name, wall, cpu, load[0]))
    print('section | wall s | CPU s | load at start'); [print(f'{n} | {w:.1f} | {c:.1f} | {l:.2f}') for n, w, c, l in rows]


if __name__ == '__main__': main()
