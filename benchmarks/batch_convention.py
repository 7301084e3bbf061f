"""The batch convention of unmodified scripts, measured: the Keras scripts of tests/multiworker/corpus and
examples/plain_keras_digits.py, each as one plain Keras process and under `hvdkeras run -np 2` with
`--batch global` and with `--batch per-worker`.

    python benchmarks/batch_convention.py [--out docs]        (make batchbench)

Prints, per script, the final loss of each side and its ratio to one process's, and the wall time of each
side; writes OUT/batch_convention.json. All sides run in this one invocation, one after the other, so the
times compare on the same machine state.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "tests" / "multiworker" / "workers" / "corpus_runner.py"
EXAMPLE = REPO / "examples" / "plain_keras_digits.py"
BIN = Path(sys.executable).parent
SIDES = {
    "one process": [],
    "global": [str(BIN / "hvdkeras"), "run", "-np", "2", "--batch", "global"],
    "per-worker": [str(BIN / "hvdkeras"), "run", "-np", "2", "--batch", "per-worker"],
}


def _env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                PYTHONPATH=str(REPO / "examples"))


def _run(cmd: list[str], cwd: Path, timeout: float) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-6000:]}")
    return done.stdout


def corpus(work: Path) -> dict:
    out: dict = {}
    for side, prefix in SIDES.items():
        folder = work / side.replace(" ", "_")
        _run([*(prefix or [sys.executable]), str(RUNNER), str(folder)], work, timeout=1800)
        for path in sorted((folder / "results" / "rank0").glob("*.json")):
            result = json.loads(path.read_text())
            out.setdefault(path.stem, {})[side] = {"loss": result["loss"], "seconds": result["seconds"],
                                                   "error": result["error"]}
    return out


def example(work: Path, epochs: int) -> dict:
    out: dict = {}
    for side, prefix in SIDES.items():
        folder = work / f"example_{side.replace(' ', '_')}"
        folder.mkdir()
        start = time.monotonic()
        stdout = _run([*(prefix or [sys.executable]), str(EXAMPLE), "--epochs", str(epochs), "--out-dir",
                       str(folder)], folder, timeout=1200)
        seconds = time.monotonic() - start
        last = [line for line in stdout.splitlines() if "val_accuracy" in line and "loss:" in line][-1]
        fields = dict(part.strip().split(": ") for part in last.split(" - ") if ": " in part)
        out[side] = {"loss": float(fields["loss"]), "val_accuracy": float(fields["val_accuracy"]),
                     "seconds": seconds}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results", help="folder for batch_convention.json")
    parser.add_argument("--epochs", type=int, default=12, help="epochs of the example")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        results = {"date": datetime.date.today().isoformat(), "corpus": corpus(work),
                   "example": example(work, args.epochs)}
    print(f"{'script':32s} {'loss: one':>10s} {'global':>10s} {'per-worker':>11s}   "
          f"{'s: one':>7s} {'global':>7s} {'per-worker':>10s}")
    for name, sides in [*results["corpus"].items(), ("plain_keras_digits (example)", results["example"])]:
        one = sides["one process"]["loss"]
        row = [sides[s]["loss"] for s in SIDES]
        ratios = " ".join(f"{v / one:6.3f}x" if one else "   -   " for v in row[1:])
        print(f"{name:32s} {row[0]:10.4f} {row[1]:10.4f} {row[2]:11.4f}   "
              f"{sides['one process']['seconds']:7.1f} {sides['global']['seconds']:7.1f} "
              f"{sides['per-worker']['seconds']:10.1f}   loss ratios {ratios}")
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "batch_convention.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
