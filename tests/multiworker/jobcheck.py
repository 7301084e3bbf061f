"""What every launcher test checks of a 2-worker training job, and the two scripts it runs.

"plain" is examples/plain_keras_digits.py, a Keras script that knows nothing of hvdkeras, run as
`python -m hvdkeras`; "init" is workers/init_script.py, which calls hvdkeras.init() itself. Each worker
writes into <out>/model/<its rank>, so a second writer of checkpoints would show.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
from pathlib import Path

from launch import REPO, WORKERS

SCRIPTS = ("plain", "init")
TRAIN_ROWS = int(1797 * 0.8)  # the digits' training split in both scripts
BATCH = 32
SINGLE_WORKER_STEPS = math.ceil(TRAIN_ROWS / BATCH)  # 45: one worker, one epoch
# Steps of each of 2 workers in one epoch: the unmodified script ("plain") keeps Keras's convention (each batch
# of 32 split over the workers: one worker's steps), the script that calls hvdkeras.init() shards the data
# itself (each worker takes whole batches: half the steps).
WORKER_STEPS = {"plain": SINGLE_WORKER_STEPS, "init": SINGLE_WORKER_STEPS / 2}
# Where each worker names its own model folder, which rank 0 never makes, rank 1 waits HVDKERAS_WRITE_WAIT for it
# first (hvdkeras.training.script_writes): 5 s here; the default, 60, is for a folder rank 0 makes too.
PER_RANK_DIR_WAIT = 5
PER_RANK_DIR_ENV = {"HVDKERAS_WRITE_WAIT": str(PER_RANK_DIR_WAIT)}
EXPECTED_FILES = {"plain": ["ckpt-01.keras", "digits.keras"], "init": ["ckpt-01.keras"]}

# How each launcher marks a line with the rank that printed it.
RANK_PREFIX = {
    "horovodrun": re.compile(r"^\[(\d+)\]<std(?:out|err)>:"),
    "srun": re.compile(r"^\s*(\d+): "),
    "mpirun": re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:"),
    "torchrun": re.compile(r"^\[default(\d+)\]:"),  # --tee 3; the local rank
}


def worker_command(kind: str, out: Path, rank_var: str, python: str = sys.executable, epochs: int = 1) -> list[str]:
    """One worker's command line; `rank_var` is the launcher's variable holding the rank."""
    if kind == "plain":
        argv = [python, "-m", "hvdkeras", "--report-dir", str(out / "report"),
                str(REPO / "examples" / "plain_keras_digits.py"), "--epochs", str(epochs)]
    else:
        argv = [python, str(WORKERS / "init_script.py"), "--report-dir", str(out / "report"), "--epochs", str(epochs)]
    return ["sh", "-c", f'HVDKERAS_WRITE_WAIT={PER_RANK_DIR_WAIT} exec {shlex.join(argv)} '
                        f'--out-dir "{out / "model"}/${{{rank_var}}}"']


def lines_by_rank(output: str, launcher: str) -> dict[int, list[str]]:
    pattern = RANK_PREFIX[launcher]
    out: dict[int, list[str]] = {}
    for line in output.splitlines():
        match = pattern.match(line)
        if match:
            out.setdefault(int(match.group(1)), []).append(line[match.end():])
    return out


def is_progress(line: str) -> bool:
    """Keras's own progress: "Epoch 3/12" and the per-epoch or progress-bar lines ("45/45 - 0s - 2ms/step")."""
    return re.match(r"^Epoch \d+/\d+", line) is not None or "/step" in line


def run_args(kind: str, out: Path, model_dir: Path, epochs: int = 1) -> list[str]:
    """`hvdkeras run` options, script and script arguments for the two scripts (one model folder given)."""
    if kind == "plain":
        return ["--report-dir", str(out / "report"), str(REPO / "examples" / "plain_keras_digits.py"),
                "--epochs", str(epochs), "--out-dir", str(model_dir)]
    return [str(WORKERS / "init_script.py"), "--report-dir", str(out / "report"), "--epochs", str(epochs),
            "--out-dir", str(model_dir)]


def check_two_workers(out: Path, kind: str, lines: dict[int, list[str]], shared_dir: bool = False) -> dict[int, dict]:
    """Asserts one correct 2-worker job; returns each rank's report (steps, digest) for the closing note.

    Each rank writes into out/model/<rank>; with `shared_dir`, both into out/model/0, where exactly one
    set of files must be.
    """
    reports = {}
    for rank in (0, 1):
        path = out / "report" / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no report"
        reports[rank] = json.loads(path.read_text())
        assert reports[rank]["size"] == 2, f"rank {rank} trained in a job of size {reports[rank]['size']}"
        steps = reports[rank]["fit_steps"][0]
        assert abs(steps - WORKER_STEPS[kind]) <= 1, f"rank {rank} ran {steps} steps, expected {WORKER_STEPS[kind]} " \
                                                    f"(one worker runs {SINGLE_WORKER_STEPS})"
    assert reports[0]["weights_sha256"] == reports[1]["weights_sha256"], "the ranks' final weights differ"
    assert sorted(p.name for p in (out / "model" / "0").iterdir()) == EXPECTED_FILES[kind]
    rank1_dir = out / "model" / "1"
    assert shared_dir or not rank1_dir.exists() or list(rank1_dir.iterdir()) == [], "rank 1 wrote files"
    assert any(is_progress(line) for line in lines.get(0, [])), "rank 0 printed no progress"
    assert not any(is_progress(line) for line in lines.get(1, [])), "rank 1 printed progress"
    print(f"{kind}: steps {[reports[r]['fit_steps'][0] for r in (0, 1)]} (1 worker: {SINGLE_WORKER_STEPS}), "
          f"digests {reports[0]['weights_sha256'][:16]} {reports[1]['weights_sha256'][:16]}")
    return reports
