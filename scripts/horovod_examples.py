"""Runs Horovod's own TensorFlow 2 example scripts with hvdkeras, their one import line changed, and checks that
each trains one model (`make horovod-examples HOROVOD_EXAMPLES=...`).

    python scripts/horovod_examples.py EXAMPLES OUT [--example NAME ...] [--launcher LAUNCHER ...]

EXAMPLES is the examples/tensorflow2 folder of a checkout of Horovod's repository (the examples are not in
Horovod's package). Each example below is copied into OUT with `import horovod.tensorflow as hvd` changed to
`import hvdkeras as hvd`, nothing else, and run on 2 workers by horovodrun and by `hvdkeras run`, with a time
limit. scripts/horovod_examples/sitecustomize.py records the weights of every model each rank made and gives
`tf.keras.datasets.mnist.load_data` the digits bundled with the examples (no download). Prints, per run, the exit
code, the seconds, the last line the example printed, whether both ranks hold the same trainable weights (one
model), and whether their non-trainable variables agree too (a BatchNormalization's moving statistics follow each
worker's own batches, in Horovod as here); exits 1 when a run fails or the ranks' trainable weights differ.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
IMPORT = "import horovod.tensorflow as hvd"
# The examples, with arguments that fit a 2-core CPU machine (their own flags).
EXAMPLES = {
    "tensorflow2_mnist.py": [],
    "tensorflow2_synthetic_benchmark.py": ["--no-cuda", "--model", "MobileNetV2", "--batch-size", "8",
                                           "--num-warmup-batches", "2", "--num-batches-per-iter", "2",
                                           "--num-iters", "3"],
}
LAUNCHERS = {
    "horovodrun": [str(VENV_BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", sys.executable],
    "hvdkeras run": [str(VENV_BIN / "hvdkeras"), "run", "-np", "2"],
}
TIMEOUT = 1800


def ported(source: Path, folder: Path) -> Path:
    text = source.read_text()
    if text.count(IMPORT) != 1:
        raise SystemExit(f"{source}: expected the line {IMPORT!r} once, found it {text.count(IMPORT)} times")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / source.name
    target.write_text(text.replace(IMPORT, "import hvdkeras as hvd"))
    return target


def run(script: Path, args: list[str], launcher: str, folder: Path) -> dict:
    digests = folder / "digests"
    shutil.rmtree(digests, ignore_errors=True)
    digests.mkdir(parents=True)
    env = dict(os.environ, EXAMPLE_DIGESTS_DIR=str(digests), TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([str(HERE / "horovod_examples"), str(HERE.parent)]))
    start = time.monotonic()
    try:
        done = subprocess.run([*LAUNCHERS[launcher], str(script), *args], cwd=folder, env=env, text=True,
                              capture_output=True, timeout=TIMEOUT)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code, output = "timeout", f"{expired.stdout or ''}{expired.stderr or ''}"
    (folder / "output.txt").write_text(output)
    ranks = [json.loads(p.read_text()) for p in sorted(digests.glob("rank*.json"))]
    models = [[(m["name"], m["trainable"]) for m in rank["models"]] for rank in ranks]
    same = len(ranks) == 2 and models[0] == models[1] and bool(models[0])
    stats_same = len(ranks) == 2 and ranks[0]["models"] == ranks[1]["models"]
    printed = [line for line in output.splitlines() if "<stdout>" in line]
    return {"example": script.name, "launcher": launcher, "exit": code, "seconds": round(time.monotonic() - start),
            "last_line": next((line for line in reversed(printed) if line.strip()), ""),
            "models": ranks[0]["models"] if ranks else [], "one_model": same,
            "same_non_trainable": stats_same}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", type=Path, help="Horovod's examples/tensorflow2 folder")
    parser.add_argument("out", type=Path, help="where the ported scripts, their output and results.json go")
    parser.add_argument("--example", action="append", choices=list(EXAMPLES), help="only these (default: all)")
    parser.add_argument("--launcher", action="append", choices=list(LAUNCHERS), help="only these (default: all)")
    options = parser.parse_args()
    examples, out = options.examples.resolve(), options.out.resolve()
    results = []
    for name in options.example or EXAMPLES:
        args = EXAMPLES[name]
        for launcher in options.launcher or LAUNCHERS:
            folder = out / launcher.replace(" ", "_") / name.removesuffix(".py")
            result = run(ported(examples / name, folder), args, launcher, folder)
            results.append(result)
            print(json.dumps(result), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["exit"] == 0 and r["one_model"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
