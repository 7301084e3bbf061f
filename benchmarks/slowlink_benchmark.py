"""Time to accuracy over a slow link: the exact allreduce, fp16, PowerSGD and the periodic reducers side by side.

    .venv/bin/python benchmarks/slowlink_benchmark.py [--rates 50mbit,10mbit] [--steps 200] [--eval-every 10]
                                                     [--variants exact,fp16,...] [--out docs]   (`make slowbench`)

Needs root (two network namespaces joined by a veth pair, as the tests' lab makes, the link shaped with tc tbf
in both directions). Nothing leaves the machine. For each link rate, one launch of slowlink_worker.py on the two
test hosts (one worker each, one compute thread each) trains the same task with every variant in turn:

- exact: hvdkeras's default allreduce; fp16: the same in float16;
- powersgd_r1, powersgd_r4: PowerSGDReducer(rank=1 or 4, start_step=20), the defaults otherwise;
- local_sgd_h4, local_sgd_h16: LocalSGDReducer(period=4 or 16, warmup_steps=20);
- diloco_h8, diloco_h32: DiLoCoReducer(period=8 or 32), the paper's outer SGD (0.7, Nesterov momentum 0.9).

For each: the bytes sent per step, counted on the link (both hosts' interface counters), the median step
time, the training time to reach the target accuracy (the exact run's final accuracy minus 0.5 point, on
20,000 held-out points, rank 0's model, evaluated every --eval-every steps with the clock stopped), and the
final accuracy. Ratios are against the exact run at the same rate, in the same run. Writes
slowlink_benchmark.json and slowlink_benchmark.png to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from network_benchmark import REPO, parse_rates, run_on_hosts

HERE = Path(__file__).resolve().parent
TARGET_GAP = 0.005  # the target: the exact run's final accuracy minus 0.5 point
# The exact steps a variant starts with (slowlink_worker.py: PowerSGD's start_step, local SGD's warm-up).
EXACT_FIRST = {"powersgd_r1": 20, "powersgd_r4": 20, "local_sgd_h4": 20, "local_sgd_h16": 20}
LABELS = {"exact": "exact allreduce", "fp16": "fp16 allreduce", "powersgd_r1": "PowerSGD rank 1",
          "powersgd_r4": "PowerSGD rank 4", "local_sgd_h4": "post-local SGD H=4",
          "local_sgd_h16": "post-local SGD H=16", "diloco_h8": "DiLoCo H=8", "diloco_h32": "DiLoCo H=32"}


def time_to(curve: list[dict], target: float) -> float | None:
    """The training seconds at the first evaluation whose accuracy reaches `target`; None if none does."""
    for point in curve:
        if point["accuracy"] >= target:
            return point["train_s"]
    return None


def summarize(ranks: list[dict]) -> dict:
    """Per variant: bytes on the link per step (both hosts), step time (slower rank), time to the target, final
    accuracy, and the ratios to the exact run; the exact run first."""
    zero = ranks[0]["variants"]
    if "exact" not in zero:
        raise ValueError(f"the exact run sets the target; it is missing. Received: variants={list(zero)}")
    final_exact = zero["exact"]["curve"][-1]["accuracy"]
    target = final_exact - TARGET_GAP
    out = {"target_accuracy": target, "exact_final_accuracy": final_exact, "variants": {}}
    for name, first in zero.items():
        steps = first["steps"]
        row = {
            "bytes_per_step": sum(r["variants"][name]["tx_bytes"] for r in ranks) / steps,
            "step_ms": max(r["variants"][name]["step_ms"] for r in ranks),
            "train_s": max(r["variants"][name]["train_s"] for r in ranks),
            "time_to_target_s": time_to(first["curve"], target),
            "final_accuracy": first["curve"][-1]["accuracy"],
            "curve": first["curve"],
        }
        out["variants"][name] = row
    derive(out)
    return out


def derive(summary: dict) -> None:
    """The ratios to the exact run, and the bytes per step after a variant's exact first steps (its total less
    those steps at the exact run's bytes per step), in place."""
    exact = summary["variants"]["exact"]
    final_exact = summary["exact_final_accuracy"]
    for name, row in summary["variants"].items():
        first, steps = EXACT_FIRST.get(name, 0), row["curve"][-1]["step"]
        row["bytes_per_step_after_start"] = ((row["bytes_per_step"] * steps - first * exact["bytes_per_step"])
                                             / (steps - first))
        row["bytes_vs_exact"] = row["bytes_per_step"] / exact["bytes_per_step"]
        row["time_to_target_vs_exact"] = (None if row["time_to_target_s"] is None or not exact["time_to_target_s"]
                                          else row["time_to_target_s"] / exact["time_to_target_s"])
        row["accuracy_gap_points"] = 100 * (row["final_accuracy"] - final_exact)


def table(rate: str, summary: dict) -> str:
    """The Markdown table of one rate (as docs/slow_links.md shows it)."""
    lines = [f"| {rate} | bytes/step (after the exact start) | vs exact | step | training time | time to target "
             "| vs exact | final accuracy (vs exact) |",
             "|---|---|---|---|---|---|---|---|"]
    exact = summary["variants"]["exact"]
    for name, row in summary["variants"].items():
        ttt = "not reached" if row["time_to_target_s"] is None else f"{row['time_to_target_s']:.1f} s"
        ratio = "" if row["time_to_target_vs_exact"] is None else f"{row['time_to_target_vs_exact']:.2f}x"
        after = row["bytes_per_step_after_start"]
        shown = f"{row['bytes_per_step'] / 1e3:,.0f} kB" + (f" ({after / 1e3:,.0f} kB)" if name in EXACT_FIRST else "")
        lines.append(f"| {LABELS.get(name, name)} | {shown} | {exact['bytes_per_step'] / after:.1f}x fewer | "
                     f"{row['step_ms']:.0f} ms | {row['train_s']:.1f} s | {ttt} | {ratio} | "
                     f"{100 * row['final_accuracy']:.2f}% ({row['accuracy_gap_points']:+.2f}) |")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(results["rates"])
    fig, axes = plt.subplots(1, len(rates), figsize=(7 * len(rates), 5), squeeze=False)
    for ax, rate in zip(axes.flat, rates):
        summary = results["rates"][rate]
        for i, (name, row) in enumerate(summary["variants"].items()):
            curve = row["curve"]
            ax.plot([p["train_s"] for p in curve], [100 * p["accuracy"] for p in curve], marker="os^vDP<>"[i % 8],
                    ms=3, lw=1, label=LABELS.get(name, name))
        ax.axhline(100 * summary["target_accuracy"], color="k", ls=":", lw=1, label="target (exact final - 0.5)")
        ax.set_xscale("log")
        ax.set_xlabel("training time, s (evaluation excluded)")
        ax.set_ylabel("held-out accuracy, % (rank 0's model)")
        ax.set_ylim(max(0, 100 * summary["target_accuracy"] - 30), 100)
        ax.set_title(f"{rate}: two test hosts, one worker each", fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Time to accuracy over a slow link, MLP 64-1024-1024-10 ({results['grad_bytes'] / 1e6:.1f} MB of "
                 f"gradients), {results['steps']} steps, {results['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="50mbit,10mbit", help="link rates as tc writes them (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=200, help="training steps per variant (default: %(default)s)")
    parser.add_argument("--eval-every", type=int, default=10, help="evaluate every this many steps")
    parser.add_argument("--variants", default=",".join(LABELS), help="comma-separated (default: all; exact first)")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where the JSON and PNG go")
    parser.add_argument("--timeout", type=float, default=5400, help="seconds per launch of the two workers")
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="no run: print the tables of an earlier run's JSON and draw its plot to --out")
    args = parser.parse_args(argv)
    if args.render is not None:
        results = json.loads(args.render.read_text())
        for rate, summary in results["rates"].items():
            derive(summary)
            print(table(rate, summary))
        args.out.mkdir(parents=True, exist_ok=True)
        plot(results, args.out / "slowlink_benchmark.png")
        return 0
    rates = parse_rates(parser, args.rates)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in LABELS]
    if unknown or not names or names[0] != "exact":
        parser.error(f"--variants takes some of {', '.join(LABELS)}, with exact first (it sets the target). "
                     f"Received: {args.variants!r}")
    if args.steps < 1 or args.eval_every < 1:
        parser.error(f"--steps and --eval-every take integers >= 1. Received: {args.steps}, {args.eval_every}")
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        print("slowlink_benchmark.py needs root, `ip` and `tc`: it makes two network namespaces and shapes the link "
              f"between them. Received: uid {os.geteuid()}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO / "lab"))
    from netlab import LabHosts

    tmp = Path(tempfile.mkdtemp(prefix="hvdk-slowlink-"))
    lab = LabHosts(tmp, subnet=79).start()
    results = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "steps": args.steps, "eval_every": args.eval_every, "rates": {}, "links": {}}
    port = 29750
    try:
        for rate_name, nominal in rates:
            lab.shape(rate_name)
            tcp_s = lab.transfer(2_000_000)
            results["links"][rate_name] = {"nominal_mbit_s": nominal / 1e6, "tcp_mbit_s": 2e6 * 8 / tcp_s / 1e6}
            print(f"[{rate_name}] TCP transfer of 2 MB: {2e6 * 8 / tcp_s / 1e6:.1f} Mbit/s", flush=True)
            out = tmp / f"slowlink-{rate_name}.json"
            run_on_hosts(lab, [str(HERE / "slowlink_worker.py"), str(out), "--variants", ",".join(names),
                               "--steps", str(args.steps), "--eval-every", str(args.eval_every),
                               "--iface", lab.IFACE], out, port, args.timeout, f"slow-link {rate_name}")
            port += 1
            ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]
            results["grad_bytes"] = ranks[0]["grad_bytes"]
            results["rates"][rate_name] = summarize(ranks)
            print(table(rate_name, results["rates"][rate_name]), flush=True)
    finally:
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "slowlink_benchmark.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.out / "slowlink_benchmark.png")
    print(f"wrote {args.out / 'slowlink_benchmark.json'} and {args.out / 'slowlink_benchmark.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
