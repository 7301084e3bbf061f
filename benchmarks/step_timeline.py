"""Where one training step's time goes over a network: every bucket of one step, on one clock.

    .venv/bin/python benchmarks/step_timeline.py [--rates 500mbit,200mbit] [--inter-op 1,0] [--env NAME=VALUE]
                                                 [--out docs]

Needs root: two test hosts joined by a shaped link (as `make netbench`), one worker on each
(benchmarks/timeline_worker.py), the network benchmark's conv model with hvdkeras's defaults, once per link
rate and inter-op thread setting. For each bucket of each recorded step, on each rank, from TensorFlow's
profiler: when its last gradient exists (the end of the last op that produces one), when its allreduce kernel
started, handing it to Horovod, and when Horovod's thread handed the reduced gradients back (the kernel's
done callback); on rank 0, from Horovod's timeline: when Horovod's negotiation began and ended and when the
Gloo transfer started and ended. Prints the median step of each rank as a table (ms from the step's start),
then rank 0's steps cut into eight shares that add up to the step (medians), and writes every step to
step_timeline.json and a figure of rank 0's median step per rate and setting to step_timeline.png in --out.

Horovod writes its timeline on rank 0 only. With its response cache (on by default) a tensor's negotiation
begins when a coordination cycle first sees it on some rank, at most one cycle (HOROVOD_CYCLE_TIME) and one
exchange of the cache's bit vectors after an allreduce kernel enqueued it, and ends in the first cycle that
sees it on every rank. The profiler adds a little time to every op; the steps' figures are those of
profiled steps.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
from network_benchmark import parse_env, parse_inter_op, parse_rates, run_on_hosts  # noqa: E402


def horovod_spans(path: Path) -> dict:
    """Horovod's timeline as {tensor: [(activity, begin, end), ...]}, in wall-clock seconds."""
    text = path.read_text().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    start = next(e["args"]["start_time_since_epoch_in_micros"] for e in events
                 if e.get("ph") == "M" and "start_time_since_epoch_in_micros" in e.get("args", {}))
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})}
    open_spans, spans = {}, {}
    for e in events:
        if e.get("ph") not in ("B", "E") or e.get("pid") not in names:
            continue
        stack = open_spans.setdefault(names[e["pid"]], [])
        if e["ph"] == "B":
            stack.append((e["name"], e["ts"]))
        elif stack:
            what, begin = stack.pop()
            spans.setdefault(names[e["pid"]], []).append((what, (start + begin) / 1e6, (start + e["ts"]) / 1e6))
    return spans


GRADIENT_BUCKET = re.compile(r"hvdkeras\.gradients\.\d+")


def one_rank(folder: Path, rank: int) -> list[dict]:
    """Every recorded step of one rank: its window, when its backward pass began and, per bucket, when its last
    gradient existed and when its allreduce kernel handed it to Horovod (TensorFlow's profiler), and on rank 0
    when Horovod negotiated and transferred it (Horovod's timeline)."""
    record = json.loads((folder / f"timeline.rank{rank}.json").read_text())
    producers = {op: bucket for bucket, names in record["bucket_ops"].items() for op in names}
    timeline = folder / f"timeline.rank{rank}.horovod.json"
    spans = horovod_spans(timeline) if timeline.exists() else {}  # Horovod writes it on rank 0 only
    steps = []
    for begin, end in zip(record["step_begin"], record["step_end"]):
        inside = [op for op in record["ops"] if begin <= op[2] <= end]
        buckets: dict[str, dict] = {name: {} for name in record["bucket_ops"]}
        for name, kind, op_begin, op_end in inside:
            bucket = GRADIENT_BUCKET.search(name) if kind.startswith("Horovod") else None
            if name in producers:
                row = buckets[producers[name]]
                row["grad_ready"] = max(row.get("grad_ready", op_end), op_end)
            elif bucket:
                buckets[bucket.group()]["reduced" if kind.endswith(".done") else "enqueued"] = op_begin
        for name, row in buckets.items():
            parts = [sp for tensor, tensor_spans in spans.items() if tensor.split("_")[0] == name
                     for sp in tensor_spans if begin <= sp[1] <= end]
            for activity, key in (("NEGOTIATE_ALLREDUCE", "negotiation"), ("GLOO_ALLREDUCE", "transfer")):
                found = [(b, e) for a, b, e in parts if a == activity]
                if found:
                    row[f"{key}_begin"] = min(b for b, _ in found)
                    row[f"{key}_end"] = max(e for _, e in found)
        backward = [op_begin for name, _, op_begin, _ in inside if name.startswith("gradient_tape/")]
        steps.append({"begin": begin, "end": end, "backward_begin": min(backward) if backward else None,
                      "buckets": dict(sorted(buckets.items(), key=lambda kv: kv[1].get("grad_ready", end)))})
    return steps


def breakdown(step: dict, peer: dict | None = None) -> dict:
    """Rank 0's step cut into eight consecutive shares (ms) that add up to the step: until the backward pass
    begins (the forward pass), until the first bucket's gradients exist, until the first allreduce kernel hands
    a bucket to Horovod (TensorFlow's executor), until some bucket is enqueued on the other rank too (`peer`,
    the other rank's same step; its compute can be behind), until the first transfer begins (Horovod's cycle
    and negotiation), the transfers themselves, the link idle between transfers, and the tail after the last
    transfer. Without `peer` the wait for the other rank counts as negotiation."""
    rows = [r for r in step["buckets"].values() if "transfer_begin" in r]
    transfers = sorted((r["transfer_begin"], r["transfer_end"]) for r in rows)
    busy, reach = 0.0, None  # the union of the transfer intervals
    for begin, end in transfers:
        if reach is None or begin > reach:
            busy += end - begin
            reach = end
        elif end > reach:
            busy += end - reach
            reach = end
    # A bucket whose producing ops Grappler fused into others has no grad_ready of its own (small buckets of
    # bias gradients); its kernel's start, which needs its gradients, stands in for it.
    first_enqueue = min(r["enqueued"] for r in step["buckets"].values())
    first_gradients = min([r["grad_ready"] for r in step["buckets"].values() if "grad_ready" in r] + [first_enqueue])
    first, last = transfers[0][0], max(end for _, end in transfers)
    on_both = first_enqueue
    if peer is not None:
        # The first instant some bucket is enqueued on both ranks: no negotiation can end before it.
        on_both = min(max(r["enqueued"], peer["buckets"][name]["enqueued"]) for name, r in step["buckets"].items()
                      if name in peer["buckets"])
        on_both = min(max(on_both, first_enqueue), first)
    shares = {"forward": step["backward_begin"] - step["begin"],
              "until_first_gradients": first_gradients - step["backward_begin"],
              "until_first_enqueue": first_enqueue - first_gradients,
              "waiting_for_the_other_rank": on_both - first_enqueue,
              "negotiation": first - on_both, "transfers": busy,
              "link_idle_between": (last - first) - busy, "tail": step["end"] - last}
    return {k: v * 1e3 for k, v in shares.items()}


COLUMNS = ("grad_ready", "enqueued", "negotiation_begin", "negotiation_end", "transfer_begin", "transfer_end",
           "reduced")


def table(step: dict) -> str:
    """One step as ms from its start: the forward pass, then a row per bucket in the order its gradients came."""
    def ms(t):
        return f"{(t - step['begin']) * 1e3:7.1f}" if t is not None else "      -"

    lines = [f"step {(step['end'] - step['begin']) * 1e3:.1f} ms; backward pass begins at {ms(step['backward_begin'])}",
             f"{'bucket':24s}" + "".join(f"{c:>19s}" for c in COLUMNS)]
    for name, row in step["buckets"].items():
        lines.append(f"{name:24s}" + "".join(f"{ms(row.get(c)):>19s}" for c in COLUMNS))
    return "\n".join(lines)


def median_step(steps: list[dict]) -> dict:
    durations = [s["end"] - s["begin"] for s in steps]
    return steps[sorted(range(len(steps)), key=lambda i: durations[i])[len(steps) // 2]]


def record(lab, tmp: Path, rate: str, inter_op: int, steps: int, timeout: float, env: dict, port: int) -> dict:
    """One run of the two timeline workers over the shaped link: every step of both ranks, and rank 0's shares
    (medians over the steps Horovod timed)."""
    folder = tmp / f"{rate}-inter_op{inter_op}"
    folder.mkdir()
    run_on_hosts(lab, [str(HERE / "timeline_worker.py"), str(folder / "timeline"), "--steps", str(steps),
                       "--inter-op", str(inter_op)], folder / "timeline", port, timeout, "timeline",
                 {**env, "HOROVOD_TIMELINE": "DYNAMIC"})  # the worker starts the timeline after warm-up
    ranks = [one_rank(folder, r) for r in (0, 1)]
    # Both ranks record the same steps, in order; the timed ones are those Horovod's timeline saw.
    peers = ranks[1] if len(ranks[1]) == len(ranks[0]) else [None] * len(ranks[0])
    timed = [(step, peer) for step, peer in zip(ranks[0], peers)
             if any("transfer_begin" in r for r in step["buckets"].values())]
    shares = [breakdown(step, peer) for step, peer in timed]
    return {"rate": rate, "inter_op": inter_op, "ranks": ranks,
            "step_ms": statistics.median((s["end"] - s["begin"]) * 1e3 for s, _ in timed),
            "breakdown_ms": {k: statistics.median(s[k] for s in shares) for k in shares[0]},
            # each timed step of rank 0: its length and its eight shares, which add up to it
            "timed_steps_ms": [{"step": (step["end"] - step["begin"]) * 1e3, **share}
                               for (step, _), share in zip(timed, shares)]}


def plot(runs: list[dict], path: Path) -> None:
    """One panel per run: rank 0's median step, a row per bucket (the order its gradients came), on one axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.2 + 2.8 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        step = median_step(run["ranks"][0])

        def ms(t, begin=step["begin"]):
            return (t - begin) * 1e3

        names = list(step["buckets"])
        for y, name in enumerate(names):
            row = step["buckets"][name]
            if "negotiation_begin" in row:
                ax.barh(y, ms(row["negotiation_end"]) - ms(row["negotiation_begin"]), left=ms(row["negotiation_begin"]),
                        color="0.8", height=0.6, label="negotiation" if y == 0 else None)
            if "transfer_begin" in row:
                ax.barh(y, ms(row["transfer_end"]) - ms(row["transfer_begin"]), left=ms(row["transfer_begin"]),
                        color="C0", height=0.6, label="Gloo transfer" if y == 0 else None)
            if "grad_ready" in row:
                ax.plot(ms(row["grad_ready"]), y, "k|", ms=14, mew=2, label="gradients exist" if y == 0 else None)
            if "enqueued" in row:
                ax.plot(ms(row["enqueued"]), y, "C1>", ms=7, label="allreduce kernel starts" if y == 0 else None)
        if step["backward_begin"] is not None:
            ax.axvline(ms(step["backward_begin"]), color="C2", ls="--", lw=1, label="backward pass begins")
        ax.axvline(ms(step["end"]), color="C3", lw=1, label="step ends")
        ax.set_yticks(range(len(names)), [n.rsplit(".", 1)[-1] for n in names])
        ax.set_ylabel("bucket")
        ax.invert_yaxis()
        shares = [f"{k.replace('_', ' ')} {v:.1f}" for k, v in run["breakdown_ms"].items()]
        shares = " + ".join(shares[:4]) + "\n+ " + " + ".join(shares[4:])
        threads = "default inter-op threads" if run["inter_op"] == 0 else f"{run['inter_op']} inter-op thread"
        ax.set_title(f"{run['rate']}, {threads}: the median step of rank 0; medians over the steps (ms):\n"
                     f"{run['step_ms']:.1f} = {shares}", fontsize=9)
        ax.set_xlim(0, ms(step["end"]) * 1.02)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1, 0].set_xlabel("ms from the step's start (rank 0)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="500mbit,200mbit", help="link rates, comma-separated, as tc writes them")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--inter-op", default="1,0",
                        help="inter-op thread settings to run, comma-separated; 0: TensorFlow's default")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in both workers, e.g. HOROVOD_CYCLE_TIME=1")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    env = dict(parse_env(parser, args.env))
    rates = [rate for rate, _ in parse_rates(parser, args.rates)]  # a bad rate fails before any host is made
    settings = parse_inter_op(parser, args.inter_op)
    if os.geteuid() != 0:
        raise SystemExit("step_timeline.py needs root (network namespaces and tc)")
    from netlab import LabHosts

    tmp = Path(tempfile.mkdtemp(prefix="hvdk-timeline-"))
    lab = LabHosts(tmp, subnet=79).start()
    runs = []
    try:
        for rate in rates:
            lab.shape(rate)
            for inter_op in settings:
                runs.append(record(lab, tmp, rate, inter_op, args.steps, args.timeout, env, 29750 + len(runs)))
    finally:
        lab.stop()
    for run in runs:
        print(f"--- {run['rate']}, inter-op threads {run['inter_op'] or 'default'}")
        for rank, steps in enumerate(run["ranks"]):
            print(f"rank {rank}, the median of {len(steps)} steps:\n{table(median_step(steps))}\n")
        print(f"rank 0, medians over the timed steps (ms): step {run['step_ms']:.1f} = "
              + " + ".join(f"{k} {v:.1f}" for k, v in run["breakdown_ms"].items()))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "step_timeline.json").write_text(json.dumps({"env": env, "runs": runs}, indent=1))
    plot(runs, out / "step_timeline.png")
    print(f"wrote {out / 'step_timeline.json'} and {out / 'step_timeline.png'}; the raw timelines are in {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
