"""`python -m hvdkeras [options] script.py [args]`: run an unmodified Keras script as one worker.

Launch it with any launcher (`horovodrun`, `mpirun`, `srun`), or use `hvdkeras run -np N script.py`, which
starts horovodrun with this on every worker. `python -m hvdkeras run|check ...` is the `hvdkeras` command.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import sys
import traceback
from typing import Callable, Sequence


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("run", "check"):
        from hvdkeras import cli

        return cli.main(argv)
    from hvdkeras.cli.parse import WRAP_FLAGS, build_worker_parser

    parser = build_worker_parser()
    ns = parser.parse_args(argv)
    if not os.path.isfile(ns.script):
        print(f"python -m hvdkeras: error: the training script does not exist. Received: script={ns.script!r}",
              file=sys.stderr)
        return 2

    import hvdkeras
    from hvdkeras import settings, wrap

    try:
        given = {name: getattr(ns, name) for name in WRAP_FLAGS if getattr(ns, name) is not None}
        options = wrap.Options(**{**wrap.options_from_env(os.environ), **given})
    except (TypeError, ValueError) as err:
        print(f"python -m hvdkeras: error: {err}", file=sys.stderr)
        return 2

    environ = settings.read()  # the settings this worker runs with, read once here and used below it
    settings.use(environ)

    def run() -> None:
        hvdkeras.init()
        wrap.install(options, write_wait=environ.write_wait)
        sys.argv = [ns.script, *ns.script_args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
        runpy.run_path(ns.script, run_name="__main__")

    _recorded(run, environ.error_dir)
    return 0


def _recorded(run: Callable[[], None], error_dir: str | None) -> None:
    """Runs the worker (forming the job, then the script); when it fails, writes this worker's error record (its
    real exit code and the end of its traceback) for the launcher's report, then fails as it would have. A
    fatal signal's Python traceback goes to standard error (faulthandler), which reaches the launcher too."""
    from hvdkeras import failures

    if not faulthandler.is_enabled():
        faulthandler.enable(file=sys.stderr, all_threads=True)
    try:
        run()
    except SystemExit as stop:
        if stop.code not in (None, 0):
            code = stop.code if isinstance(stop.code, int) else 1
            failures.write_error_record(failures.error_record(code, traceback.format_exc()), error_dir)
        raise
    except BaseException as error:
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
        failures.write_error_record(failures.error_record(code, traceback.format_exc()), error_dir)
        raise


if __name__ == "__main__":
    sys.exit(main())
