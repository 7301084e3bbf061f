"""Custom training loops against fit, side by side in one run: the step of a tf.function GradientTape loop
under hvdkeras (with hvdkeras.DistributedGradientTape, and unmodified, made data-parallel by `hvdkeras run`'s
patch) against the same model's fit step with hvdkeras.DistributedOptimizer, and against Horovod's own
DistributedGradientTape: on Keras 3 (given the tf.Variables it needs) and with tf-keras (Keras 2), where
Horovod's TF2 loop is documented to run.

    python benchmarks/loop_benchmark.py [--out docs] [--model conv] [--rate 200mbit] [--steps 8] [--rounds 4]

Two workers on this host (torchrun-style variables, 127.0.0.1), then one on each of the two test hosts with the
link shaped to --rate (needs root, ip and tc: network namespaces joined by a veth pair, as in
network_benchmark.py). Each worker trains on its own batches in every variant (see loop_worker.py). A step's
time is the slower worker's median interval of each round; the rounds' medians are reported, and each
variant's ratio to fit and to Horovod's tf-keras tape loop. Writes OUT/loop_benchmark.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "loop_worker.py"


def _env(rank: int, addr: str, port: int, keras2: bool) -> dict:
    from network_benchmark import clean_env

    return dict(clean_env(), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                MASTER_ADDR=addr, MASTER_PORT=str(port), OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2",
                PYTHONUNBUFFERED="1", **({"TF_USE_LEGACY_KERAS": "1"} if keras2 else {}))


def _argv(kind: str, out: Path, args) -> list[str]:
    return [str(WORKER), kind, str(out), "--model", args.model, "--steps", str(args.steps), "--rounds",
            str(args.rounds), "--warmup", str(args.warmup)]


def _read(out: Path) -> list[dict]:
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]


def local(kind: str, out: Path, args, port: int) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, *_argv(kind, out, args)], cwd=str(REPO), text=True,
                              env=_env(r, "127.0.0.1", port, kind == "keras2"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
             for r in range(2)]
    outputs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("\n".join(f"--- rank {r} exit {p.returncode}\n{o[-4000:]}"
                                   for r, (p, o) in enumerate(zip(procs, outputs))))
    return _read(out)


def on_hosts(kind: str, out: Path, args, lab, port: int) -> list[dict]:
    from network_benchmark import run_on_hosts

    env = {"TF_USE_LEGACY_KERAS": "1"} if kind == "keras2" else {}
    run_on_hosts(lab, _argv(kind, out, args), out, port, timeout=1800, what=f"loop benchmark ({kind})", env=env)
    return _read(out)


def steps(ranks: list[dict]) -> dict[str, float]:
    """Per variant: the median over rounds of the slower worker's step (s)."""
    names = ranks[0]["rounds_s"]
    return {v: statistics.median(max(r["rounds_s"][v][i] for r in ranks) for i in range(len(names[v])))
            for v in names}


def summarize(k3: dict, k2: dict) -> dict:
    times = {**k3, **k2}
    return {"step_ms": {v: round(t * 1e3, 2) for v, t in times.items()},
            "over_fit": {v: round(times[v] / times["fit"], 3) for v in ("tape", "unmodified", "horovod_tape")},
            "over_horovod_tape_keras2": {v: round(times[v] / times["horovod_tape_keras2"], 3)
                                         for v in ("fit", "tape", "unmodified")}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs")
    parser.add_argument("--model", default="conv", choices=["conv", "mlp"])
    parser.add_argument("--rate", default="200mbit", help="the two test hosts' link; 'none' skips the hosts")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    if args.steps < 2 or args.rounds < 1:
        parser.error(f"--steps must be >= 2 and --rounds >= 1. Received: --steps {args.steps} --rounds {args.rounds}")
    sys.path.insert(0, str(HERE))
    started = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="hvdk-loopbench-"))
    report = {"date": datetime.date.today().isoformat(), "model": args.model, "steps": args.steps,
              "rounds": args.rounds, "settings": {}}
    report["settings"]["2 workers, this host"] = summarize(steps(local("keras3", tmp / "local3", args, 29911)),
                                                          steps(local("keras2", tmp / "local2", args, 29912)))
    if args.rate != "none":
        from network_benchmark import shape

        from netlab import LabHosts

        lab = LabHosts(tmp / "hosts", subnet=83).start()
        try:
            shape(lab, args.rate, 0)
            k3 = steps(on_hosts("keras3", tmp / "hosts3", args, lab, 29913))
            k2 = steps(on_hosts("keras2", tmp / "hosts2", args, lab, 29914))
        finally:
            lab.stop()
        report["settings"][f"2 test hosts, {args.rate}"] = summarize(k3, k2)
    report["seconds"] = round(time.time() - started)
    for setting, row in report["settings"].items():
        print(f"{setting}: step (ms) {row['step_ms']}")
        print(f"  over fit: {row['over_fit']}; over Horovod's tf-keras tape loop: {row['over_horovod_tape_keras2']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "loop_benchmark.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
