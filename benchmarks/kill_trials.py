"""Nothing lost to a kill: rank 0 of a 2-worker `hvdkeras run` job is SIGKILLed at random moments while
ModelCheckpoint, BackupAndRestore or `model.save` writes, --trials times each (kill_worker.py).

    python benchmarks/kill_trials.py [--trials 20] [--seed 0] [--out docs]

After each kill:
- every file where a checkpoint is expected (ckpt-NN.keras, model.keras) loads with plain Keras, in a process
  that never imports hvdkeras, and the newest one is there (no partial file under a final name);
- for BackupAndRestore, the same command run again resumes from the backup and its final weights equal an
  uninterrupted run's bit for bit, on both ranks.
Each trial draws the epoch of the kill (1 to epochs - 2) and its moment inside the write (a fraction of the
previous epoch's write time, 0 to 1.2: most land inside the write, some just after it). Prints one line per trial
and a summary; with --out writes OUT/kill_trials.json. Exits 1 if any trial lost anything.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "kill_worker.py"
EPOCHS = 5
WRITERS = ("checkpoint", "backup", "save")

# Loads each path with plain Keras (no hvdkeras import anywhere in this process): prints {path: error or ""}.
_LOAD = """
import json, sys
import keras
out = {}
for path in sys.argv[1:]:
    try:
        keras.saving.load_model(path)
        out[path] = ""
    except Exception as err:
        out[path] = f"{type(err).__name__}: {err}"[:300]
print(json.dumps(out))
"""


def _env() -> dict:
    sys.path.insert(0, str(HERE))
    from network_benchmark import clean_env

    return dict(clean_env(), TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def launch(writer: str, out: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(Path(sys.executable).parent / "hvdkeras"), "run", "-np", "2", str(WORKER), writer, str(out),
           "--epochs", str(EPOCHS), *extra]
    return subprocess.run(cmd, env=_env(), cwd=str(out), capture_output=True, text=True, timeout=timeout)


def load_errors(paths: list[Path]) -> dict[str, str]:
    if not paths:
        return {}
    done = subprocess.run([sys.executable, "-c", _LOAD, *map(str, paths)], env=_env(), capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0:
        return {str(p): f"the loading process failed: {done.stderr[-500:]}" for p in paths}
    return json.loads(done.stdout.strip().splitlines()[-1])


def weights(out: Path, rank: int) -> list[np.ndarray]:
    with np.load(out / f"weights.rank{rank}.npz") as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def trial(writer: str, out: Path, kill_epoch: int, fraction: float, whole: Path | None) -> dict:
    """One kill and its checks; returns the trial's record (`lost` lists what went wrong, empty if nothing)."""
    killed = launch(writer, out, "--kill-epoch", str(kill_epoch), "--kill-fraction", f"{fraction:.3f}")
    record = {"writer": writer, "kill_epoch": kill_epoch, "fraction": round(fraction, 3), "lost": []}
    kill = json.loads((out / "kill.json").read_text()) if (out / "kill.json").exists() else None
    if killed.returncode == 0 or kill is None:
        record["lost"].append(f"the job was not killed as planned (exit {killed.returncode}): "
                              f"{killed.stdout[-1500:]}{killed.stderr[-1500:]}")
        return record
    record["write_seconds"] = round(kill["write_seconds"], 3)
    record["delay_seconds"] = round(kill["delay"], 3)
    if writer == "checkpoint":
        expected = sorted(out.glob("ckpt-*.keras"))
        newest = out / f"ckpt-{kill_epoch:02d}.keras"  # epoch kill_epoch - 1 (0-based) written in full
        if not newest.exists():
            record["lost"].append(f"the newest complete checkpoint {newest.name} is missing")
    elif writer == "save":
        expected = [out / "model.keras"]
        if not expected[0].exists():
            record["lost"].append("model.keras is missing after a kill in a later save")
    else:
        expected = []
    record["files_checked"] = len(expected)
    record["left_over"] = sorted(p.name for p in out.iterdir() if p.name.startswith("."))
    for path, error in load_errors([p for p in expected if p.exists()]).items():
        if error:
            record["lost"].append(f"{Path(path).name} does not load with plain Keras: {error}")
    if writer == "backup":
        resumed = launch(writer, out)
        if resumed.returncode != 0:
            record["lost"].append(f"the resume failed (exit {resumed.returncode}): {resumed.stderr[-1500:]}")
        else:
            diffs = [max(float(np.max(np.abs(a - b))) for a, b in zip(weights(out, r), weights(whole, r)))
                     for r in (0, 1)]
            record["resume_max_abs_diff"] = max(diffs)
            if max(diffs) != 0.0:
                record["lost"].append(f"the resumed run differs from the uninterrupted one (max {max(diffs):.3g})")
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="kills per writer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--writers", default=",".join(WRITERS))
    parser.add_argument("--out", type=Path, default=None, help="folder for kill_trials.json")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    records = []
    with tempfile.TemporaryDirectory(prefix="hvdkeras-kill-") as tmp:
        root = Path(tmp)
        whole = root / "whole"
        done = launch("backup", whole)
        if done.returncode != 0:
            raise SystemExit(f"the uninterrupted run failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        for writer in args.writers.split(","):
            for n in range(args.trials):
                kill_epoch, fraction = rng.randint(1, EPOCHS - 2), rng.uniform(0.0, 1.2)
                record = trial(writer, root / f"{writer}-{n}", kill_epoch, fraction, whole)
                records.append(record)
                print(f"{writer:10s} trial {n:2d}: killed {record.get('delay_seconds', '?')} s into epoch "
                      f"{kill_epoch}'s write of {record.get('write_seconds', '?')} s: "
                      + ("nothing lost" if not record["lost"] else "LOST " + "; ".join(record["lost"])), flush=True)
    summary = {w: {"trials": sum(r["writer"] == w for r in records),
                   "inside_the_write": sum(r["writer"] == w and r["fraction"] < 1 for r in records),
                   "lost": sum(r["writer"] == w and bool(r["lost"]) for r in records)}
               for w in args.writers.split(",")}
    print(json.dumps(summary))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kill_trials.json").write_text(json.dumps(
            {"date": datetime.date.today().isoformat(), "seed": args.seed, "epochs": EPOCHS, "summary": summary,
             "trials": records}, indent=1) + "\n")
    return 1 if any(r["lost"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
