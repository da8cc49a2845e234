"""`nbdev_test`, one fresh process per notebook, without paying the interpreter's start-up once per notebook.

`nbdev_test --path nb` in a process of its own per notebook keeps notebooks that re-register library classes (e.g.
03b_llm's LLMPolicy into memlab.agent.POLICIES) from leaking into each other, but every process then imports Python,
nbdev, IPython, pandas and matplotlib again: about 1.2 s of CPU per notebook, 99 notebooks. Here one parent imports
those third-party libraries once (never memlab: its registries must start empty in every notebook) and forks a child
per notebook, so each notebook still runs in a process no other notebook has touched.
Longest notebooks (by size) go first, so that the last ones to finish are short. Exit 1 naming the failed notebooks.

    python tests/run_nbdev_tests.py [-j 2] [notebook ...]     # default: every notebook under nbs/ but nbs/sections/
"""
import argparse, multiprocessing as mp, multiprocessing.connection as mp_connection, os, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _warm():
    "Import the third-party libraries every notebook needs, once, in the parent (memlab itself is not imported)."
    import nbdev.test, execnb.shell, IPython, numpy, pandas, matplotlib, matplotlib.pyplot, scipy.stats  # noqa: F401
    assert not any(m == 'memlab' or m.startswith('memlab.') for m in sys.modules), 'memlab imported in the parent'


def _run(fn: str):
    "Test one notebook in this (freshly forked) process with nbdev's own `test_nb` and nbdev_test's flags; exit 1 on failure."
    from nbdev.config import get_config
    from nbdev.test import test_nb
    from fastcore.xtras import working_directory
    cfg = get_config()
    with working_directory(cfg.nbs_path):
        ok, _ = test_nb(Path(fn), skip_flags=cfg.tst_flags.split(), force_flags=[], basepath=cfg.config_path)
    sys.stdout.flush(); sys.stderr.flush()
    sys.exit(0 if ok else 1)


def run_all(todo: list, jobs: int) -> list:
    "Fork one process per notebook (not daemonic: a notebook may start processes of its own), `jobs` at a time; the failed."
    ctx, running, failed, todo = mp.get_context('fork'), {}, [], list(todo)
    while todo or running:
        while todo and len(running) < jobs:
            fn = todo.pop(0); p = ctx.Process(target=_run, args=(fn,), name=Path(fn).name); p.start(); running[p.sentinel] = (p, fn)
        for s in mp_connection.wait(list(running)):
            p, fn = running.pop(s); p.join()
            if p.exitcode != 0: failed.append(fn)
    return failed


def notebooks(paths: list) -> list:
    "The notebooks to test, longest first: `paths`, or every notebook under nbs/ outside nbs/sections/."
    from nbdev.test import _keep_file
    found = [Path(p).resolve() for p in paths] or [p.resolve() for p in (ROOT / 'nbs').rglob('*.ipynb')
                                                  if 'sections' not in p.relative_to(ROOT / 'nbs').parts[:1]
                                                  and '.ipynb_checkpoints' not in p.parts]
    return sorted((str(p) for p in found if _keep_file(p, '.notest')), key=lambda p: -os.path.getsize(p))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('notebooks', nargs='*', help='notebooks to test (default: every library notebook)')
    ap.add_argument('-j', '--jobs', type=int, default=2, help='notebooks run at once (default 2)')
    a = ap.parse_args(argv)
    os.chdir(ROOT)
    _warm()
    todo, t0 = notebooks(a.notebooks), time.time()
    failed = [os.path.relpath(fn, ROOT) for fn in run_all(todo, a.jobs)]
    print(f'nbdev tests: {len(todo) - len(failed)} of {len(todo)} notebooks passed in {time.time() - t0:.0f} s')
    if failed: print('failed:\n\t' + '\n\t'.join(map(str, failed)), file=sys.stderr)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
