"""`memlab ARGS` through `memlab.cli.main` in the test process, as the console script runs it (not a test module).

Hundreds of bad-input cases each end before any work; a fresh interpreter per case would spend seconds importing
memlab for milliseconds of checking. Cases that can hang (a FIFO as a data file) or kill a process stay in real
subprocesses.
"""
import contextlib, io


def memlab_main(args) -> dict:
    "Exit code, stdout+stderr and stderr of `memlab ARGS` run in this process."
    from memlab.cli import main
    out, err, rc = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: main(list(map(str, args)))
        except SystemExit as e: rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:             # what the console script would print as a traceback
            import traceback; rc = 1; err.write(''.join(traceback.format_exception(e)))
    return dict(rc=rc, out=out.getvalue() + err.getvalue(), err=err.getvalue())
