"""XLA kept for the forward and backward pass against XLA off, three models, side by side in one run.

    python benchmarks/xla_benchmark.py [--out docs] [--steps 8] [--rounds 3] [--no-hosts]   (make xlabench)

1. One process (horovodrun -np 1): hvdkeras both ways, and Keras alone with and without XLA.
2. Two workers on this host (horovodrun -np 2 over Gloo).
3. Two workers on the two test hosts (needs root, ip and tc; network namespaces joined by a veth pair, as in
   benchmarks/network_benchmark.py), one per host, the link shaped for each model so that the allreduce of
   its gradients takes about as long as its one-process step: rate = gradient bytes / that step.

Kept: the model compiles with jit_compile=True; hvdkeras compiles Keras's step up to the update and reduces
the gradients after it (no overlap with the backward pass). Off: jit_compile=False; the gradients' buckets go
out while the backward pass runs. Writes OUT/xla_benchmark.json and OUT/xla_benchmark.png; prints kept / off.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "xla_worker.py"
BIN = Path(sys.executable).parent
MODELS = ("mlp", "conv", "transformer")


def _env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                PYTHONPATH=str(REPO))


def _read(out: Path, n: int) -> list[dict]:
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(n)]


def local(n: int, args, plain: bool) -> list[dict]:
    out = Path(tempfile.mkdtemp(prefix="hvdk-xlabench-")) / "result"
    cmd = [str(BIN / "horovodrun"), "-np", str(n), "-H", f"localhost:{n}", "--gloo", sys.executable, str(WORKER),
           str(out), "--models", ",".join(MODELS), "--steps", str(args.steps), "--rounds", str(args.rounds),
           *(["--plain"] if plain else [])]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-6000:]}")
    return _read(out, n)


def on_hosts(rates: dict[str, str], args) -> dict[str, list[dict]]:
    """Each model on the two test hosts, its link shaped to rates[model]."""
    from network_benchmark import run_on_hosts, shape

    from netlab import LabHosts

    tmp = Path(tempfile.mkdtemp(prefix="hvdk-xlabench-hosts-"))
    lab = LabHosts(tmp, subnet=81).start()
    results = {}
    try:
        for k, name in enumerate(MODELS):
            shape(lab, rates[name], 0)
            out = tmp / f"{name}"
            argv = [str(WORKER), str(out), "--models", name, "--steps", str(args.steps), "--rounds", str(args.rounds)]
            run_on_hosts(lab, argv, out, 29870 + k, timeout=1200, what="xla benchmark")
            results[name] = _read(out, 2)
    finally:
        lab.stop()
    return results


def host_rate(grad_bytes: int, step_s: float) -> str:
    """The tc rate at which a 2-worker ring allreduce of `grad_bytes` (each worker sends them all) takes
    `step_s`: communication about as long as the compute."""
    return f"{max(1, round(grad_bytes * 8 / step_s / 1e6))}mbit"


def slowest(ranks: list[dict], name: str, variant: str) -> float:
    """A step lasts as long as its slowest worker's."""
    return max(r["models"][name]["step_s"][variant] for r in ranks)


def summary(ranks: list[dict]) -> dict:
    out = {}
    for name in ranks[0]["models"]:
        times = {v: slowest(ranks, name, v) for v in ranks[0]["models"][name]["step_s"]}
        out[name] = {"step_s": times, "kept_over_off": times["kept"] / times["off"],
                     "kept": all(r["models"][name]["kept"] for r in ranks)}
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [s for s in ("one process", "2 workers, this host", "2 workers, 2 hosts") if s in report["settings"]]
    fig, axes = plt.subplots(1, len(MODELS), figsize=(5 * len(MODELS), 4))
    for ax, name in zip(axes, MODELS):
        for k, variant in enumerate(("off", "kept")):
            ax.bar([i + 0.4 * k for i in range(len(settings))],
                   [report["settings"][s][name]["step_s"][variant] * 1e3 for s in settings], width=0.4,
                   label="XLA kept (forward, backward)" if variant == "kept" else "XLA off")
        ax.set_xticks([i + 0.2 for i in range(len(settings))], [s.replace(", ", "\n") for s in settings], fontsize=8)
        ratios = ", ".join(f"{report['settings'][s][name]['kept_over_off']:.2f}" for s in settings)
        ax.set_title(f"{name}: step (ms); kept / off {ratios}", fontsize=9)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"hvdkeras, XLA kept for the compute against XLA off ({report['date']}, {report['host']})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-hosts", action="store_true", help="skip the two test hosts (they need root)")
    args = parser.parse_args()
    if args.steps < 2 or args.rounds < 1:
        parser.error(f"--steps must be >= 2 and --rounds >= 1. Received: --steps {args.steps} --rounds {args.rounds}")
    started = time.time()
    report = {"date": datetime.date.today().isoformat(), "host": f"{os.cpu_count()} cores", "steps": args.steps,
              "rounds": args.rounds, "settings": {}}
    one = local(1, args, plain=True)
    report["settings"]["one process"] = summary(one)
    report["settings"]["2 workers, this host"] = summary(local(2, args, plain=False))
    report["params"] = {n: one[0]["models"][n]["params"] for n in MODELS}
    report["grad_bytes"] = {n: one[0]["models"][n]["grad_bytes"] for n in MODELS}
    if not args.no_hosts:
        rates = {n: host_rate(report["grad_bytes"][n], slowest(one, n, "off")) for n in MODELS}
        report["host_rates"] = rates
        hosts = on_hosts(rates, args)
        report["settings"]["2 workers, 2 hosts"] = {n: summary(hosts[n])[n] for n in MODELS}
    report["seconds"] = round(time.time() - started)
    for setting, models in report["settings"].items():
        for name, row in models.items():
            times = ", ".join(f"{v} {t * 1e3:.1f} ms" for v, t in row["step_s"].items())
            print(f"{setting:22s} {name:12s} {times}; kept / off {row['kept_over_off']:.3f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "xla_benchmark.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "xla_benchmark.png")


if __name__ == "__main__":
    main()
