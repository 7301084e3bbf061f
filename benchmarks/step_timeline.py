"""Where one training step's time goes over a network: every bucket of one step, on one clock.

    .venv/bin/python benchmarks/step_timeline.py [--rate 200mbit] [--inter-op 1] [--out docs]

Needs root: two test hosts joined by a shaped link (as `make netbench`), one worker on each
(benchmarks/timeline_worker.py), the network benchmark's conv model with hvdkeras's defaults. For each bucket
of each recorded step, on each rank: when its last gradient exists, when its allreduce was enqueued, when
Horovod's negotiation ended, when the Gloo transfer started and ended, and when the reduced gradients
exist. Prints the median step of each rank as a table (ms from the step's start), then rank 0's steps cut
into five shares that add up to the step (medians), and writes every step to step_timeline.json in --out.

Horovod writes its timeline on rank 0 only, so rank 1's rows have only the two instants of its own graph.
Those come from timestamp ops that wait for the tensors, and the executor runs them when a thread is free:
with one inter-op thread they may run late, so they are upper bounds. Horovod's instants are exact (its
enqueue is the allreduce kernel's start).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests" / "multiworker"))
from network_benchmark import run_on_hosts  # noqa: E402


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


def one_rank(folder: Path, rank: int) -> list[dict]:
    """Every recorded step of one rank: its window, its forward end and, per bucket, the six instants."""
    record = json.loads((folder / f"timeline.rank{rank}.json").read_text())
    marks = []
    for line in record["marks"]:
        what, name, stamp = line.split()
        marks.append((what, name, float(stamp.strip('"'))))
    timeline = folder / f"timeline.rank{rank}.horovod.json"
    spans = horovod_spans(timeline) if timeline.exists() else {}  # Horovod writes it on rank 0 only
    steps = []
    for begin, end in zip(record["step_begin"], record["step_end"]):
        inside = [(w, n, t) for w, n, t in marks if begin <= t <= end]
        buckets = {}
        for what, name, stamp in inside:
            if what in ("grad_ready", "reduced"):
                buckets.setdefault(name, {})[what] = stamp
        for name, row in buckets.items():
            parts = [sp for tensor, tensor_spans in spans.items() if tensor.split("_")[0] == name
                     for sp in tensor_spans if begin <= sp[1] <= end]
            for activity, key in (("NEGOTIATE_ALLREDUCE", "negotiation"), ("GLOO_ALLREDUCE", "transfer")):
                found = [(b, e) for a, b, e in parts if a == activity]
                if found:
                    row[f"{key}_begin"] = min(b for b, _ in found)
                    row[f"{key}_end"] = max(e for _, e in found)
        forward = [t for w, _, t in inside if w == "forward_end"]
        steps.append({"begin": begin, "end": end, "forward_end": forward[0] if forward else None,
                      "buckets": dict(sorted(buckets.items(), key=lambda kv: kv[1].get("grad_ready", 0)))})
    return steps


def breakdown(step: dict) -> dict:
    """Rank 0's step cut into five consecutive shares (ms) that add up to the step, from Horovod's instants:
    until the first allreduce is enqueued, the first negotiation, the transfers themselves, the link idle
    between transfers, and the tail after the last transfer."""
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
    first_enqueue = min(r["negotiation_begin"] for r in rows)
    first, last = transfers[0][0], max(end for _, end in transfers)
    shares = {"until_first_enqueue": first_enqueue - step["begin"], "first_negotiation": first - first_enqueue,
              "transfers": busy, "link_idle_between": (last - first) - busy, "tail": step["end"] - last}
    return {k: v * 1e3 for k, v in shares.items()}


COLUMNS = ("grad_ready", "negotiation_begin", "negotiation_end", "transfer_begin", "transfer_end", "reduced")


def table(step: dict) -> str:
    """One step as ms from its start: the forward pass, then a row per bucket in the order its gradients came."""
    def ms(t):
        return f"{(t - step['begin']) * 1e3:7.1f}" if t is not None else "      -"

    lines = [f"step {(step['end'] - step['begin']) * 1e3:.1f} ms; forward pass ends at {ms(step['forward_end'])}",
             f"{'bucket':24s}" + "".join(f"{c:>19s}" for c in COLUMNS)]
    for name, row in step["buckets"].items():
        lines.append(f"{name:24s}" + "".join(f"{ms(row.get(c)):>19s}" for c in COLUMNS))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--inter-op", type=int, default=1, help="inter-op threads; 0: TensorFlow's default")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("step_timeline.py needs root (network namespaces and tc)")
    from lab import LabHosts

    tmp = Path(tempfile.mkdtemp(prefix="hvdk-timeline-"))
    lab = LabHosts(tmp, subnet=79).start()
    try:
        lab.shape(args.rate)
        run_on_hosts(lab, [str(HERE / "timeline_worker.py"), str(tmp / "timeline"), "--steps", str(args.steps),
                           "--inter-op", str(args.inter_op)], tmp / "timeline", 29750, args.timeout, "timeline",
                     {"HOROVOD_TIMELINE": "DYNAMIC"})  # the worker starts the timeline after warm-up
    finally:
        lab.stop()
    result = {"rate": args.rate, "inter_op": args.inter_op, "ranks": [one_rank(tmp, r) for r in (0, 1)]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for rank, steps in enumerate(result["ranks"]):
        durations = [s["end"] - s["begin"] for s in steps]
        median = sorted(range(len(steps)), key=lambda i: durations[i])[len(steps) // 2]
        print(f"rank {rank}, the median of {len(steps)} steps:\n{table(steps[median])}\n")
    timed = [step for step in result["ranks"][0] if any("transfer_begin" in r for r in step["buckets"].values())]
    shares = [breakdown(step) for step in timed]
    result["breakdown_ms"] = {k: statistics.median(s[k] for s in shares) for k in shares[0]}
    steps_ms = [(s["end"] - s["begin"]) * 1e3 for s in timed]
    print(f"rank 0, medians over {len(shares)} steps (ms): step {statistics.median(steps_ms):.1f} = "
          + " + ".join(f"{k} {v:.1f}" for k, v in result["breakdown_ms"].items()))
    (out / "step_timeline.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'step_timeline.json'}; the raw timelines are in {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
