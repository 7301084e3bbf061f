"""Step-time percentiles and slow runs: 2 workers on two test hosts, quiet and with competing CPU-bound processes.

    .venv/bin/python benchmarks/stall_benchmark.py [--rate 100mbit] [--runs 20] [--steps 20] [--launches 1]
                                                   [--competing 0,1,2] [--nice default,none] [--inter-op 0]
                                                   [--image-size 32] [--batch 64] [--env NAME=VALUE] [--out docs]
                                                                                        (`make stallbench`)

Needs root: the network benchmark's lab (two network namespaces joined by a veth pair, the link shaped with tc
tbf), one worker on each host (benchmarks/stall_worker.py), the network benchmark's conv model (2.3 MB of
gradients) on 32x32 inputs, 64 per worker and step (its compute about 60% of its communication at 100 Mbit/s),
with hvdkeras's defaults in `model.fit`, one intra-op thread per worker and TensorFlow's inter-op threads
(--inter-op). For each number of competing processes
(`python -c "while True: pass"`, started before the workers and running throughout) and each setting of
HVDKERAS_HOROVOD_NICE (default: Horovod's threads at nice -15 across hosts; none: left as Horovod starts them),
one launch of --runs runs of --steps steps. Prints and writes, per configuration: the steps' median, p90, p99
and max (rank 0's step intervals), the share of steps over 3x the median, each run's mean step, and the runs
in the slow mode: a run whose mean step is above t_local + t_comm measured in the same launch (compute and
communication one after the other, nothing hidden). Per run it also gives when rank 0 handed its gradient
buckets to Horovod (ms into the step, its median first and last hand-over), whether both ranks handed them
over in the same order, and how long the first bucket waited for the other rank (stall_worker.py's stamps).
Writes stall_benchmark.json to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
from network_benchmark import parse_env, parse_nice, parse_rates, run_on_hosts  # noqa: E402


def summarize(ranks: list[dict]) -> dict:
    """Rank 0's step intervals as percentiles (ms), the runs' means, and the runs in the slow mode."""
    r0 = ranks[0]
    steps = np.array([s for run in r0["runs"] for s in run]) * 1e3
    median = float(np.median(steps))
    bound = (r0["t_local"] + r0["t_comm"]) * 1e3
    means = [float(np.mean(run)) * 1e3 for run in r0["runs"]]
    return {"steps": int(steps.size), "median_ms": median, "p90_ms": float(np.percentile(steps, 90)),
            "p99_ms": float(np.percentile(steps, 99)), "max_ms": float(steps.max()),
            "p99_over_median": float(np.percentile(steps, 99)) / median,
            "over_3x_median": int((steps > 3 * median).sum()),
            "t_local_ms": r0["t_local"] * 1e3, "t_comm_ms": r0["t_comm"] * 1e3, "no_overlap_bound_ms": bound,
            "run_means_ms": means, "slow_runs": sum(m > bound for m in means),
            "steps_ms": [[s * 1e3 for s in run] for run in r0["runs"]], **handovers(ranks)}


def handovers(ranks: list[dict]) -> dict:
    """Per run: the share of steps in which both ranks handed the buckets to Horovod in the same order, the
    median wait from the first hand-over on either rank until some bucket was handed over on both (no transfer
    starts before it), and each rank's most frequent order."""
    if not all(r.get("stamps") for r in ranks):
        return {}
    same, waits, orders = [], [], []
    for run0, run1, o0, o1 in zip(ranks[0]["stamps"], ranks[1]["stamps"], ranks[0]["orders"], ranks[1]["orders"]):
        same.append(sum(a == b for a, b in zip(o0, o1)) / max(len(o0), 1))
        waits.append(float(np.median([
            (min(max(a, b) for a, b in zip(s0, s1)) - min(min(s0), min(s1))) * 1e3 for s0, s1 in zip(run0, run1)])))
        orders.append([max(set(o), key=o.count) for o in (o0, o1)])
    spans = []  # rank 0: the median first and last hand-over of each run, ms from its step's start
    for run, begins in zip(ranks[0]["stamps"], ranks[0].get("begins") or []):
        spans.append([float(np.median([(f(s) - b) * 1e3 for s, b in zip(run, begins)])) for f in (min, max)])
    return {"same_order_share": same, "wait_for_both_ms": waits, "orders": orders, "handed_over_ms": spans}


def report(rate: str, row: dict) -> None:
    print(f"[{rate}, {row['competing']} competing, nice {row['nice']}, launch {row['launch'] + 1}] {row['steps']} "
          f"steps: median {row['median_ms']:.0f} ms, p90 {row['p90_ms']:.0f}, p99 {row['p99_ms']:.0f} "
          f"({row['p99_over_median']:.2f}x), max {row['max_ms']:.0f}; {row['over_3x_median']} over 3x the median; "
          f"t_local {row['t_local_ms']:.0f} + t_comm {row['t_comm_ms']:.0f} = {row['no_overlap_bound_ms']:.0f} ms; "
          f"runs' means {', '.join(f'{m:.0f}' for m in row['run_means_ms'])}; slow runs {row['slow_runs']} of "
          f"{len(row['run_means_ms'])}", flush=True)
    if "orders" in row:
        print("  per run: mean step, steps with the same order on both ranks, wait until a bucket is on both (ms), "
              "rank 0's first and last hand-over (ms into the step), the ranks' usual orders: " + "; ".join(
                  f"{m:.0f} ms {s:.0%} {w:.0f} [{h[0]:.0f}-{h[1]:.0f}] {'/'.join(o)}" for m, s, w, h, o in
                  zip(row["run_means_ms"], row["same_order_share"], row["wait_for_both_ms"],
                      row["handed_over_ms"] or [[0, 0]] * len(row["orders"]), row["orders"])),
              flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", default="100mbit", help="the link's rate as tc writes it (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=20, help="runs of steps per configuration")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--launches", type=int, default=1,
                        help="launches of the two workers per configuration, each its own row (default: 1)")
    parser.add_argument("--competing", default="0,1,2", metavar="N,...",
                        help="numbers of competing CPU-bound processes, each a configuration (default: %(default)s)")
    parser.add_argument("--nice", default="default,none", metavar="SETTING,...",
                        help="HVDKERAS_HOROVOD_NICE settings, each a configuration (default: %(default)s)")
    parser.add_argument("--image-size", type=int, default=32, help="the conv model's input side (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=64, help="samples per worker and step (default: %(default)s)")
    parser.add_argument("--inter-op", type=int, default=0,
                        help="the workers' inter-op threads (default: 0, TensorFlow's choice, what a user gets who "
                             "sets nothing; 1 shows the slow mode of docs/network.md)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="set in both workers")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where stall_benchmark.json goes")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per launch of the two workers")
    args = parser.parse_args(argv)
    (rate, _), = parse_rates(parser, args.rate)
    nices = parse_nice(parser, args.nice)
    competing = [c.strip() for c in args.competing.split(",") if c.strip()]
    if not competing or not all(c.isdigit() for c in competing):
        parser.error(f"--competing takes counts >= 0, comma-separated. Received: {args.competing!r}")
    if args.runs < 1 or args.steps < 2 or args.launches < 1:
        parser.error(f"--runs and --launches take >= 1 and --steps >= 2. Received: --runs {args.runs} --steps "
                     f"{args.steps} --launches {args.launches}")
    env = dict(parse_env(parser, args.env))
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        print("stall_benchmark.py needs root, `ip` and `tc`. Received: "
              f"uid {os.geteuid()}, ip={shutil.which('ip')}, tc={shutil.which('tc')}", file=sys.stderr)
        return 2

    from netlab import LabHosts

    tmp = Path(tempfile.mkdtemp(prefix="hvdk-stallbench-"))
    lab = LabHosts(tmp, subnet=79).start()
    results = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "rate": rate, "runs": args.runs, "steps": args.steps, "env": env, "image_size": args.image_size,
               "batch": args.batch, "inter_op": args.inter_op,
               "load_before": os.getloadavg()[0], "configurations": []}
    port = 29760
    try:
        lab.shape(rate)
        tcp_s = lab.transfer(4_000_000)
        results["tcp_mbit_s"] = 4e6 * 8 / tcp_s / 1e6
        print(f"[{rate}] TCP transfer of 4 MB: {results['tcp_mbit_s']:.0f} Mbit/s", flush=True)
        for count, nice, launch in [(c, n, i) for c in map(int, competing) for n in nices
                                    for i in range(args.launches)]:
            out = tmp / f"stall-{count}-{nice}-{launch}.json"
            argv = [str(HERE / "stall_worker.py"), str(out), "--runs", str(args.runs), "--steps", str(args.steps),
                    "--image-size", str(args.image_size), "--batch", str(args.batch), "--inter-op", str(args.inter_op)]
            nice_env = {} if nice == "default" else {"HVDKERAS_HOROVOD_NICE": nice}
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
            try:
                run_on_hosts(lab, argv, out, port, args.timeout, "stall", {**env, **nice_env})
            finally:
                for proc in busy:
                    proc.kill()
                    proc.wait()
            port += 1
            ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]
            row = {"competing": count, "nice": nice, "launch": launch, **summarize(ranks)}
            results["configurations"].append(row)
            report(rate, row)
    finally:
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stall_benchmark.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out / 'stall_benchmark.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
