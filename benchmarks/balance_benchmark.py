"""ZeRO's balance: the optimizer state each worker holds with shard_optimizer_state=True, variables cut into pieces
(the default) against each variable owned whole and against unsharded, side by side in one run, on this host.

    python benchmarks/balance_benchmark.py [--out docs] [--steps 30] [--rounds 5]          (make balancebench)

Two models with Adam, each at N = 2 and 4 workers: the MLP Dense(32->256), Dense(256->256), Dense(256->4), where
one kernel holds 87% of the parameters, and a model whose Embedding(2000, 64) holds 30% of them. Per run: the
largest worker's share of the job's optimizer state (goal: at most 1/N + 1%), the extra memory of the slice
variables, the peak resident memory, and the median step time (each configuration once per round, --rounds
rounds; the fastest round counts, and the ratio to unsharded is also taken round by round, with its median).
Writes OUT/sharding_balance.json and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharding_benchmark import run as run_job  # noqa: E402

# Each way: whether the state is sharded, and the worker's arguments for it.
WAYS = (("unsharded", False, ()), ("whole", True, ("--whole",)), ("pieces", True, ()))


def run(model: str, n: int, shard: bool, extra: tuple[str, ...], steps: int) -> list[dict]:
    return run_job(n, 0, shard, steps, timeout=900, extra=("--model", model, "--batch", "32", *extra))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    started = time.time()
    runs: dict = {}
    for k in range(args.rounds):  # every configuration once per round: the machine's drift hits them alike
        for model in ("mlp", "embedding"):
            for n in (2, 4):
                for way, shard, extra in WAYS:
                    ranks = run(model, n, shard, extra, args.steps)
                    runs.setdefault((model, n, way), []).append(ranks)
                    print(f"round {k + 1}: {model} N={n} {way}: step "
                          f"{max(r['step_seconds'] for r in ranks) * 1000:.1f} ms", flush=True)
    rows = []
    for (model, n, way), rounds in runs.items():
        ranks = rounds[0]
        state = [r["optimizer_state_elements"] for r in ranks]
        job = state[0] if way == "unsharded" else sum(state)
        steps = [max(r["step_seconds"] for r in ranks) for ranks in rounds]
        row = {"model": model, "workers": n, "way": way, "params": ranks[0]["params"],
               "largest_share": max(state) / job, "shares": [s / job for s in state],
               "goal": 1 / n + 0.01 if way == "pieces" else None,
               "slice_bytes": max(r["slice_bytes"] for r in ranks),
               "peak_rss_bytes": max(r["peak_rss_bytes"] for ranks in rounds for r in ranks),
               "step_seconds_rounds": steps, "step_seconds": min(steps)}
        rows.append(row)
        print(f"{model:9} N={n} {way:9}: largest worker holds {row['largest_share']:.3f} of the state "
              f"(1/N = {1 / n:.3f}), slices {row['slice_bytes'] / 2**10:6.1f} KiB, peak RSS "
              f"{row['peak_rss_bytes'] / 2**20:6.0f} MiB, step (fastest of {len(steps)} rounds) "
              f"{row['step_seconds'] * 1000:6.1f} ms", flush=True)
    by = {(r["model"], r["workers"], r["way"]): r for r in rows}
    ratios = {}
    for model in ("mlp", "embedding"):
        for n in (2, 4):
            pieces = by[(model, n, "pieces")]
            unsharded = by[(model, n, "unsharded")]
            # Round by round (each round ran both within minutes of each other) and their median: the machine's
            # drift moves a configuration by up to 2x between rounds.
            paired = [p / u for p, u in zip(pieces["step_seconds_rounds"], unsharded["step_seconds_rounds"])]
            ratios[f"{model} N={n}"] = {
                "pieces_step_vs_unsharded": pieces["step_seconds"] / unsharded["step_seconds"],
                "pieces_step_vs_unsharded_rounds": paired,
                "pieces_step_vs_unsharded_median": statistics.median(paired),
                "pieces_step_vs_whole": pieces["step_seconds"] / by[(model, n, "whole")]["step_seconds"],
                "pieces_share_within_goal": pieces["largest_share"] <= pieces["goal"]}
            r = ratios[f"{model} N={n}"]
            print(f"{model} N={n}: pieces / unsharded step time {r['pieces_step_vs_unsharded']:.3f} (median of the "
                  f"rounds' ratios {r['pieces_step_vs_unsharded_median']:.3f}), pieces / whole "
                  f"{r['pieces_step_vs_whole']:.3f}, largest share within 1/N + 1%: {r['pieces_share_within_goal']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"date": datetime.date.today().isoformat(), "host": f"{os.cpu_count()} cores",
              "seconds": round(time.time() - started), "optimizer": "Adam", "steps": args.steps, "batch": 32,
              "rounds": args.rounds,
              "rows": rows, "ratios": ratios}
    (out / "sharding_balance.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
