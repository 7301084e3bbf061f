"""ZeRO's balance: the optimizer state each worker holds with shard_optimizer_state=True, variables cut into pieces
(the default) against each variable owned whole and against unsharded, and the step time of each, on this host.

    python benchmarks/balance_benchmark.py [--out docs] [--steps 60] [--rounds 8] [--batches 32,1024]
                                                                                          (make balancebench)

Two models with Adam, each at N = 2 and 4 workers: the MLP Dense(32->256), Dense(256->256), Dense(256->4), where
one kernel holds 87% of the parameters, and a model whose Embedding(2000, 64) holds 30% of them
(benchmarks/balance_models.py).

- The state and memory: one job per model, N and way (benchmarks/sharding_worker.py, 30 steps, batch 32): the
  largest worker's share of the job's optimizer state (goal: at most 1/N + 1%), the extra memory of the slice
  variables, the peak resident memory.
- The step time: one job per model, N and batch per worker (benchmarks/balance_step_worker.py), in which every
  way trains in the same processes, taking turns, --rounds rounds of --steps steps each; so each round's ratio
  compares steps taken within seconds of each other (between jobs, the same configuration moved by up to 1.6x
  on this host). Besides the three ways, "ungathered": the sharded step less the allgather of the updated weights
  (a diagnostic; the workers' weights part), which shows what that one collective costs.

Writes OUT/sharding_balance.json and prints the tables.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from pathlib import Path

from sharding_benchmark import launch
from sharding_benchmark import run as run_job

STEP_WORKER = Path(__file__).resolve().parent / "balance_step_worker.py"
MODELS = ("mlp", "embedding")
SIZES = (2, 4)
# Each way of the state's table: whether the state is sharded, and the worker's arguments for it.
WAYS = (("unsharded", False, ()), ("whole", True, ("--whole",)), ("pieces", True, ()))
STEP_WAYS = ("unsharded", "whole", "pieces", "ungathered")
GOAL_STEP_RATIO = 1.10  # the sharded step's goal against the unsharded one


def state_rows(steps: int = 30) -> list[dict]:
    """The balance table: one job per model, N and way."""
    rows = []
    for model in MODELS:
        for n in SIZES:
            for way, shard, extra in WAYS:
                ranks = run_job(n, 0, shard, steps, timeout=900,
                                extra=("--model", model, "--batch", "32", *extra))
                state = [r["optimizer_state_elements"] for r in ranks]
                job = state[0] if way == "unsharded" else sum(state)
                row = {"model": model, "workers": n, "way": way, "params": ranks[0]["params"],
                       "largest_share": max(state) / job, "shares": [s / job for s in state],
                       "goal": 1 / n + 0.01 if way == "pieces" else None,
                       "slice_bytes": max(r["slice_bytes"] for r in ranks),
                       "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks)}
                rows.append(row)
                print(f"{model:9} N={n} {way:9}: largest worker holds {row['largest_share']:.3f} of the state "
                      f"(1/N = {1 / n:.3f}), slices {row['slice_bytes'] / 2**10:6.1f} KiB, peak RSS "
                      f"{row['peak_rss_bytes'] / 2**20:6.0f} MiB", flush=True)
    return rows


def step_row(ranks: list[dict]) -> dict:
    """One step-time job's figures: each way's step per round (the slowest rank's: the ranks wait for each other
    at every collective), the fastest round, and each way's ratio to unsharded round by round, with its median."""
    first = ranks[0]
    rounds = {way: [max(r["rounds"][way][k] for r in ranks) for k in range(len(first["rounds"][way]))]
              for way in STEP_WAYS}
    ratios = {way: [a / b for a, b in zip(rounds[way], rounds["unsharded"])] for way in STEP_WAYS[1:]}
    median = {way: statistics.median(v) for way, v in ratios.items()}
    return {"model": first["model"], "workers": first["size"], "batch": first["batch"], "steps": first["steps"],
            "step_seconds_rounds": rounds, "step_seconds": {way: min(v) for way, v in rounds.items()},
            "ratio_to_unsharded_rounds": ratios, "ratio_to_unsharded_median": median,
            "pieces_within_goal": median["pieces"] <= GOAL_STEP_RATIO,
            # What the weights' allgather adds to the sharded step, in the median round's terms.
            "allgather_share_median": statistics.median(
                [(p - u) / p for p, u in zip(rounds["pieces"], rounds["ungathered"])])}


def step_rows(batches: list[int], steps: int, rounds: int) -> list[dict]:
    rows = []
    for model in MODELS:
        for n in SIZES:
            for batch in batches:
                ranks = launch(n, STEP_WORKER, ["--model", model, "--batch", str(batch), "--steps", str(steps),
                                                "--rounds", str(rounds)], timeout=1800)
                row = step_row(ranks)
                rows.append(row)
                fast, med = row["step_seconds"], row["ratio_to_unsharded_median"]
                print(f"{model:9} N={n} batch {batch:5}: step (fastest round) "
                      + ", ".join(f"{w} {fast[w] * 1000:.1f}" for w in STEP_WAYS) + " ms; against unsharded "
                      f"(median of {rounds} rounds): " + ", ".join(f"{w} {med[w]:.2f}" for w in STEP_WAYS[1:])
                      + f"; the weights' allgather {row['allgather_share_median']:.0%} of the sharded step",
                      flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs")
    parser.add_argument("--steps", type=int, default=60, help="steps per way per round of the step-time jobs")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of the step-time jobs")
    parser.add_argument("--batches", default="32,1024", help="batch sizes per worker of the step-time jobs")
    args = parser.parse_args()
    started = time.time()
    rows = state_rows()
    steps = step_rows([int(b) for b in args.batches.split(",")], args.steps, args.rounds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"date": datetime.date.today().isoformat(), "host": f"{os.cpu_count()} cores",
              "seconds": round(time.time() - started), "optimizer": "Adam", "rows": rows,
              "shares_within_goal": all(r["largest_share"] <= r["goal"] for r in rows if r["goal"]),
              "step_goal": GOAL_STEP_RATIO, "step_rounds": args.rounds, "step_rows": steps}
    (out / "sharding_balance.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
