"""Runs the Keras scripts of tests/multiworker/corpus one after the other in this process, as they are.

    python corpus_runner.py OUT [NAME ...]                      # plain Keras, one process
    hvdkeras run -np 2 corpus_runner.py OUT [NAME ...]          # the same scripts, data-parallel

Each script runs with `runpy` as `__main__` in its own folder OUT/<name> (the same folder on every rank,
as for a script started twice in one directory). The runner records, per rank, in OUT/results/rank<R>/<name>.json:
- "error": the traceback, if the script raised (the runner goes on with the next script);
- "writes": what this rank wrote into the script's folder (Python-level opens for writing, renames and new
  folders, seen by an audit hook);
- "files": the files in the folder afterwards;
- "digest": sha256 of the weights of the script's `model` at the end;
- "loss": the last epoch's "loss" in the script's `history` (or its first key when it has no "loss"): fit's
  History, or a dict of lists that a custom loop keeps;
- "seconds": how long the script ran.
Lines "### corpus <name> begin/end" delimit each script's output.
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

import keras
import numpy as np

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

_watch: dict = {"dir": None, "writes": []}


def _record(path) -> None:
    folder = _watch["dir"]
    if folder is None or not isinstance(path, (str, bytes, os.PathLike)):
        return
    full = os.path.abspath(os.fsdecode(path))
    if full.startswith(folder + os.sep):
        _watch["writes"].append(os.path.relpath(full, folder))


def _audit(event: str, args: tuple) -> None:
    if event == "open":
        path, mode, flags = args
        if (mode and any(c in mode for c in "wax+")) or (not mode and flags & WRITE_FLAGS):
            _record(path)
    elif event == "os.rename":
        _record(args[1])
    elif event == "os.mkdir":
        _record(args[0])


def _digest(model) -> str:
    digest = hashlib.sha256()
    for w in model.get_weights():
        digest.update(np.ascontiguousarray(w).tobytes())
    return digest.hexdigest()


def _final_loss(history):
    # fit's History, or the dict of per-epoch lists a custom loop keeps
    logs = history if isinstance(history, dict) else (getattr(history, "history", None) or {})
    key = "loss" if "loss" in logs else next(iter(logs), None)
    return None if key is None else float(logs[key][-1])


def run(name: str, out: Path, rank: int) -> dict:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    result: dict = {"name": name, "rank": rank, "error": None}
    print(f"### corpus {name} begin", flush=True)
    cwd, argv = os.getcwd(), sys.argv
    os.chdir(folder)
    sys.argv = [str(CORPUS / f"{name}.py")]
    _watch.update(dir=str(folder.resolve()), writes=[])
    loops = sys.modules.get("hvdkeras.training.loops")
    if loops is not None:  # a script that called hvdkeras.init() itself marks only its own process explicit
        loops._state["explicit"] = False
    start = time.monotonic()
    try:
        namespace = runpy.run_path(str(CORPUS / f"{name}.py"), run_name="__main__")
        result["digest"] = _digest(namespace["model"])
        result["loss"] = _final_loss(namespace.get("history"))
    except BaseException:  # noqa: BLE001 - record it and go on with the next script
        result["error"] = traceback.format_exc()
        print(result["error"], file=sys.stderr, flush=True)
    finally:
        result["seconds"] = time.monotonic() - start
        _watch["dir"] = None
        os.chdir(cwd)
        sys.argv = argv
        keras.backend.clear_session()
        keras.config.set_dtype_policy("float32")
    result["writes"] = sorted(set(_watch["writes"]))
    result["files"] = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    print(f"### corpus {name} end", flush=True)
    return result


def main() -> int:
    out = Path(sys.argv[1]).resolve()
    names = sys.argv[2:] or sorted(p.stem for p in CORPUS.glob("*.py"))
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    results_dir = out / "results" / f"rank{rank}"
    results_dir.mkdir(parents=True, exist_ok=True)
    sys.addaudithook(_audit)
    failed = 0
    for name in names:
        result = run(name, out, rank)
        failed += result["error"] is not None
        (results_dir / f"{name}.json").write_text(json.dumps(result, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
