"""Training over a network: two test hosts joined by a shaped link, one worker on each, 1 thread each.

    .venv/bin/python benchmarks/network_benchmark.py [--rates 500mbit,200mbit,50mbit] [--delay-ms 0]
                                                     [--models conv,mlp] [--inter-op 1,0] [--out docs]
                                                     [--compute cpu|device] [--nice default,none]
                                                     [--competing N]                  (`make netbench`)

Needs root (it makes two network namespaces joined by a veth pair, as the tests' lab does, and shapes the
link with tc tbf in both directions). Nothing leaves the machine. For each link rate and each inter-op thread
setting of the workers (1, the published configuration, and 0, TensorFlow's default: what a user gets who sets
nothing), all in one run:

- the link: a TCP transfer between the hosts and one Horovod allreduce of the gradients' bytes, next to the
  nominal rate; the run stops, reporting nothing, when the link is not what was asked for;
- t_local: the same fit with a plain optimizer (no communication); t_comm: the gradients' grouped allreduce
  alone (and in float16);
- hvdkeras: the default (bucketed, overlapped), the single grouped allreduce after the backward pass
  (bucket_bytes=0), and fp16 compression;
- Horovod side by side: its DistributedOptimizer on tf-keras (Keras 2, against its own t_local) and its
  DistributedGradientTape loop on Keras 3, and hvdkeras's DistributedOptimizer in that same loop (the
  reduction alone compared, without what `fit` adds to a step);
- the bounds no overlap t_local + t_comm, perfect overlap max(t_local, t_comm), after the forward pass
  max(t_local, t_forward + t_comm) (no gradient exists before the forward pass ends), after the first bucket
  max(t_local, t_first + t_comm) (t_first: the forward pass and the gradients of hvdkeras's first bucket,
  timed alone: no allreduce starts before they exist), and the reachable bound,
  the larger of that and the CPU floor: CPU per step and worker of the local step plus the allreduce's own
  (with one compute thread per worker and one core per host, the allreduce's CPU work cannot hide);
  overlap = (t_local + t_comm - t_step) / min(t_local, t_comm), the share of the hideable time hidden against
  perfect overlap, and overlap_after_forward the same against the after-forward bound; scaling efficiency =
  t_local / t_step.

--compute device replaces each model's compute by timed waits that take no core, calibrated to the model's
own per-layer times on this machine (device_compute.py): what a GPU host's communication sees, whose cores
the compute leaves free. Horovod's tf-keras integration has no such stand-in and is left out; the rest is
the same. The first launch's calibration serves every later one of the run, so every rate and setting waits
the same times; --calibration takes them from an earlier run's network_device.json instead (the published
run's, so that a run on another day, on a faster or slower machine, waits the same times). It writes
network_device.json and network_device.png instead.

--nice runs each setting of HVDKERAS_HOROVOD_NICE in turn (default: the job's own, -15 across hosts; none:
Horovod's threads left alone), and --competing N keeps N CPU-bound processes running on the machine
throughout, as another job on a shared host would.

Every variant is timed in interleaved rounds inside the same two processes; figures are medians over the
rounds of each round's median step, with the spread (min-max over rounds), and each variant's CPU time and
time waiting for a core (the threads' run delay) per step and worker (all threads). Writes network_benchmark.json and
network_benchmark.png to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

KERAS3_VARIANTS = ("hvdkeras", "hvdkeras_single", "hvdkeras_fp16", "horovod_tape", "hvdkeras_loop")
LABELS = {"hvdkeras": "hvdkeras (default: buckets)", "hvdkeras_single": "hvdkeras bucket_bytes=0 (one allreduce)",
          "hvdkeras_fp16": "hvdkeras fp16", "horovod_tape": "Horovod DistributedGradientTape (Keras 3)",
          "horovod_keras2": "Horovod DistributedOptimizer (tf-keras)",
          "hvdkeras_loop": "hvdkeras DistributedOptimizer in Horovod's tape loop"}
# A link is what was asked for when one allreduce of the gradients' bytes runs at this fraction of the nominal
# rate: above it the shaping is not in effect, below it something else (CPU, the machine) is the limit.
LINK_OK = (0.45, 1.15)


class LinkError(RuntimeError):
    """The shaped link is not what was asked for; nothing is reported."""


def parse_rate(text: str) -> float:
    """'1gbit', '200mbit', '50mbit', '500kbit' -> bits per second."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(k|m|g)bit\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"a link rate is a number and kbit, mbit or gbit (as tc writes it), "
                                         f"such as 200mbit. Received: {text!r}")
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def shape(lab, rate: str, delay_ms: float) -> None:
    if not delay_ms:
        lab.shape(rate)
        return
    for host in lab.NAMES:
        proc = subprocess.run(lab.ns(host, "tc", "qdisc", "replace", "dev", lab.IFACE, "root", "netem", "delay",
                                     f"{delay_ms}ms", "rate", rate, "limit", "10000"),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise LinkError(f"--delay-ms {delay_ms} needs tc's netem, and this kernel refused it "
                            f"({proc.stderr.strip()}); run with --delay-ms 0 (rate shaping only, tbf)")


def clean_env() -> dict:
    """This environment without another launcher's variables (they would win over the lab's)."""
    drop = ("HOROVOD_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_LOCAL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def parse_rates(parser: argparse.ArgumentParser, text: str) -> list[tuple[str, float]]:
    """--rates as [(rate as tc writes it, bits per second)]; a bad rate is the parser's error."""
    try:
        return [(r.strip(), parse_rate(r)) for r in text.split(",") if r.strip()]
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))


def parse_inter_op(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """--inter-op as distinct thread counts (0: TensorFlow's default); anything else is the parser's error."""
    settings = [v.strip() for v in text.split(",") if v.strip()]
    if not settings or not all(v.isdigit() for v in settings) or len(set(settings)) != len(settings):
        parser.error(f"--inter-op takes distinct integers >= 0, comma-separated (0: TensorFlow's default). "
                     f"Received: {text!r}")
    return [int(v) for v in settings]


def parse_env(parser: argparse.ArgumentParser, items: list[str]) -> list[tuple[str, str]]:
    """The --env NAME=VALUE options, in order; a malformed one is the parser's error."""
    env = []
    for item in items:
        if "=" not in item:
            parser.error(f"--env takes NAME=VALUE. Received: {item!r}")
        env.append(tuple(item.split("=", 1)))
    return env


def run_on_hosts(lab, argv: list[str], out: Path, port: int, timeout: float, what: str,
                 env: dict | None = None) -> None:
    """Starts `python argv` on both test hosts (torchrun-style variables, rank 0 on the first), each logging to
    OUT.rankN.log, and waits; raises with both logs' tails when a worker fails or the timeout passes."""
    procs, logs = [], []
    for rank, host in enumerate(lab.NAMES):
        worker_env = dict(clean_env(), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR=lab.NAMES[0], MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                          TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **(env or {}))
        log = open(out.parent / f"{out.name}.rank{rank}.log", "w+")
        logs.append(log)
        procs.append(subprocess.Popen(lab.ns(host, sys.executable, *argv), env=worker_env, stdout=log,
                                      stderr=subprocess.STDOUT, cwd=str(REPO), start_new_session=True))
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                time.sleep(5)  # let the other worker report why, then stop it
                break
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
            p.wait()
    codes = [p.returncode for p in procs]
    if codes != [0, 0]:
        tails = []
        for rank, log in enumerate(logs):
            log.seek(0)
            tails.append(f"--- rank {rank} (exit {codes[rank]}) ---\n" + "".join(log.readlines()[-25:]))
        why = "timed out" if time.monotonic() >= deadline else "failed"
        raise RuntimeError(f"the {what} workers {why} after {timeout:.0f} s at most:\n" + "\n".join(tails))


def run_pair(lab, kind: str, out: Path, port: int, args, timeout: float, inter_op: int,
             nice: str = "default") -> list[dict]:
    """Runs net_worker.py on both test hosts and returns each rank's figures."""
    argv = [str(HERE / "net_worker.py"), kind, str(out), "--models", args.models, "--steps", str(args.steps),
            "--rounds", str(args.rounds), "--warmup", str(args.warmup), "--inter-op", str(inter_op),
            "--compute", args.compute, *(["--sweep", args.sweep] if kind == "keras3" and args.sweep else []),
            *(["--calibration", str(out.parent / "calibration.json")] if args.compute == "device" else [])]
    env = dict(args.env, **({"TF_USE_LEGACY_KERAS": "1"} if kind == "keras2" else {}),
               **({} if nice == "default" else {"HVDKERAS_HOROVOD_NICE": nice}))
    run_on_hosts(lab, argv, out, port, timeout, kind, env)
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]


def per_worker(ranks: list[dict], model: str, key: str, variant: str) -> float:
    """CPU, or waiting for a core, per step and worker (ms): the ranks' mean per round, then the median."""
    if key not in ranks[0]["models"][model]:
        return 0.0
    rounds = zip(*(r["models"][model][key][variant] for r in ranks))
    return statistics.median(statistics.mean(per_rank) for per_rank in rounds) * 1e3


def combine(ranks: list[dict], model: str) -> dict:
    """Per variant: each round's slower rank (the job waits for it), then the median and spread over rounds."""
    rounds = {}
    for variant in ranks[0]["models"][model]["rounds_s"]:
        per_round = [max(r["models"][model]["rounds_s"][variant][i] for r in ranks)
                     for i in range(len(ranks[0]["models"][model]["rounds_s"][variant]))]
        rounds[variant] = {"median_ms": statistics.median(per_round) * 1e3,
                           "min_ms": min(per_round) * 1e3, "max_ms": max(per_round) * 1e3,
                           "rounds_ms": [t * 1e3 for t in per_round],
                           "cpu_ms": per_worker(ranks, model, "cpu_rounds_s", variant),
                           "wait_ms": per_worker(ranks, model, "wait_rounds_s", variant)}
    return rounds


def derive(t_step: float, t_local: float, t_comm: float, t_forward: float, cpu_floor: float = 0.0,
           t_first: float | None = None) -> dict:
    """A step's figures against its bounds. The after-forward bound max(t_local, t_forward + t_comm) is the best
    step when all communication waits for the forward pass (no gradient exists before it ends). `cpu_floor` is
    the CPU one step needs per worker, its compute's and its allreduce's (see summarize); the reachable bound is
    the larger of the two. `t_first`, the forward pass with the gradients of the first bucket, gives the
    after-first-bucket bound max(t_local, t_first + t_comm): no allreduce starts before that bucket exists."""
    after_forward = max(t_local, t_forward + t_comm)
    reachable = max(after_forward, cpu_floor)
    first = {}
    if t_first is not None:
        after_first = max(t_local, t_first + t_comm)
        first = {"after_first_bucket_bound_ms": after_first, "vs_after_first_bucket_bound": t_step / after_first - 1}
    return {**first, "step_ms": t_step, "no_overlap_ms": t_local + t_comm, "perfect_overlap_ms": max(t_local, t_comm),
            "after_forward_bound_ms": after_forward, "reachable_bound_ms": reachable,
            "overlap": (t_local + t_comm - t_step) / min(t_local, t_comm),
            "overlap_after_forward": (t_local + t_comm - t_step) / (t_local + t_comm - after_forward),
            "scaling_efficiency": t_local / t_step,
            "vs_perfect_overlap": t_step / max(t_local, t_comm) - 1,
            "vs_after_forward_bound": t_step / after_forward - 1,
            "vs_reachable_bound": t_step / reachable - 1}


def summarize(k3: dict, k2: dict | None, nbytes: int) -> dict:
    t_local, t_comm, t_comm16 = (k3[k]["median_ms"] for k in ("local", "comm", "comm_fp16"))
    t_forward = k3["forward"]["median_ms"]
    t_first = k3["first_bucket"]["median_ms"] if "first_bucket" in k3 else None
    # CPU per step and worker (all threads): the local step's, and the allreduce's alone. Where the workers'
    # compute already fills their cores (one compute thread per worker and one core per test host here), the
    # allreduce's own CPU work (Gloo's copies and sums, TCP) cannot hide behind the backward pass: it takes
    # the core from it. Their sum is then a floor under the step that no overlap can beat.
    cpu_local, cpu_comm = k3["local"]["cpu_ms"], k3["comm"]["cpu_ms"]
    cpu_comm16 = k3["comm_fp16"]["cpu_ms"]
    out = {"grad_bytes": nbytes, "t_local_ms": t_local, "t_comm_ms": t_comm, "t_comm_fp16_ms": t_comm16,
           "t_forward_ms": t_forward, "t_first_bucket_ms": t_first,
           # No gradient exists before the forward pass ends: an estimate of the best step when communication is
           # the longer part (from parts measured apart, so a step can come out a little under it).
           "after_forward_bound_ms": max(t_local, t_forward + t_comm),
           "cpu_local_ms": cpu_local, "cpu_comm_ms": cpu_comm, "cpu_floor_ms": cpu_local + cpu_comm,
           "wait_local_ms": k3["local"]["wait_ms"],
           "fp16_comm_cut": t_comm / t_comm16, "t_link_ms": k3["link"]["median_ms"],
           "t_local_keras2_ms": k2["local"]["median_ms"] if k2 else None,
           "timings": {**k3, **{f"keras2_{k}": v for k, v in (k2 or {}).items()}},
           "variants": {}}
    for v in (*KERAS3_VARIANTS, *sorted((k for k in k3 if k.startswith("hvdkeras_b")), key=lambda k: int(k[10:]))):
        fp16 = v == "hvdkeras_fp16"
        out["variants"][v] = derive(k3[v]["median_ms"], t_local, t_comm16 if fp16 else t_comm, t_forward,
                                    cpu_local + (cpu_comm16 if fp16 else cpu_comm), t_first)
        out["variants"][v]["spread_ms"] = [k3[v]["min_ms"], k3[v]["max_ms"]]
        out["variants"][v]["cpu_ms"] = k3[v]["cpu_ms"]
        out["variants"][v]["wait_ms"] = k3[v]["wait_ms"]
        # Against Horovod's tape loop round by round (they run in the same rounds, on the same processes): the
        # median of the differences, which the machine's drift between rounds affects less than the medians' gap.
        out["variants"][v]["vs_tape_paired_ms"] = statistics.median(
            a - b for a, b in zip(k3[v]["rounds_ms"], k3["horovod_tape"]["rounds_ms"]))
    if not k2:
        return out
    out["variants"]["horovod_keras2"] = derive(k2["horovod_keras2"]["median_ms"], k2["local"]["median_ms"], t_comm,
                                               t_forward, k2["local"]["cpu_ms"] + cpu_comm, t_first)
    out["variants"]["horovod_keras2"]["spread_ms"] = [k2["horovod_keras2"]["min_ms"], k2["horovod_keras2"]["max_ms"]]
    out["variants"]["horovod_keras2"]["cpu_ms"] = k2["horovod_keras2"]["cpu_ms"]
    out["variants"]["horovod_keras2"]["wait_ms"] = k2["horovod_keras2"]["wait_ms"]
    return out


def _default_bucket_bytes() -> int:
    from hvdkeras.settings import DEFAULT_BUCKET_BYTES

    return DEFAULT_BUCKET_BYTES


def check_link(rate_name: str, nominal: float, nbytes: int, t_link_ms: float) -> dict:
    """A 2-worker ring allreduce sends the tensor's bytes once each way over the link."""
    measured = nbytes * 8 / (t_link_ms / 1e3)
    ratio = measured / nominal
    if not LINK_OK[0] <= ratio <= LINK_OK[1]:
        raise LinkError(f"asked for {rate_name}, but an allreduce of {nbytes / 1e6:.1f} MB ran at "
                        f"{measured / 1e6:.0f} Mbit/s ({ratio:.2f}x the nominal rate; accepted "
                        f"{LINK_OK[0]}-{LINK_OK[1]}x): not reporting this link")
    return {"allreduce_mbit_s": measured / 1e6, "allreduce_vs_nominal": ratio}


def read_calibration(parser: argparse.ArgumentParser, path: Path) -> dict:
    """--calibration: the per-layer times by model ({model: [{name, forward_s, backward_s, shapes}, ...]}) of an
    earlier run's network_device.json, from its first run."""
    try:
        runs = json.loads(path.read_text())["runs"]
        times = runs[0]["calibration"]
        if not isinstance(times, dict) or not all(
                isinstance(layers, list) and all({"forward_s", "backward_s", "shapes"} <= set(t) for t in layers)
                for layers in times.values()):
            raise ValueError
        return times
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        parser.error(f"--calibration takes an earlier --compute device run's JSON (network_device.json), whose runs "
                     f"hold their per-layer times. Received: {str(path)!r}, which is not one")


def threads_label(inter_op: int, nice: str = "default") -> str:
    threads = "default inter-op threads" if inter_op == 0 else f"{inter_op} inter-op thread{'s' * (inter_op > 1)}"
    return threads if nice == "default" else f"{threads}, HVDKERAS_HOROVOD_NICE={nice}"


def parse_nice(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """--nice as distinct settings: default (the job's own), none, or a nice value from -20 to 19."""
    settings = [v.strip() for v in text.split(",") if v.strip()]
    ok = all(v in ("default", "none") or re.fullmatch(r"-?\d+", v) and -20 <= int(v) <= 19 for v in settings)
    if not settings or not ok or len(set(settings)) != len(settings):
        parser.error(f"--nice takes distinct settings, comma-separated: default, none or a nice value from -20 "
                     f"to 19. Received: {text!r}")
    return settings


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    models = list(runs[0]["models"])
    fig, axes = plt.subplots(len(runs), len(models), figsize=(max(6.5 * len(models), 10), 5.2 * len(runs)),
                             squeeze=False)
    for ax, (run, model) in zip(axes.flat, [(run, model) for run in runs for model in models]):
        links = run["models"][model]
        rates = [results["links"][r]["nominal_mbit_s"] for r in links]
        rows = list(links.values())
        best = [x["variants"]["hvdkeras"]["perfect_overlap_ms"] for x in rows]
        worst = [x["variants"]["hvdkeras"]["no_overlap_ms"] for x in rows]
        ax.fill_between(rates, best, worst, color="0.88", label="between the bounds (Keras 3 t_local, t_comm)")
        ax.plot(rates, best, "k--", lw=1, label="perfect overlap max(t_local, t_comm)")
        ax.plot(rates, worst, "k:", lw=1, label="no overlap t_local + t_comm")
        ax.plot(rates, [x["variants"]["hvdkeras"]["reachable_bound_ms"] for x in rows], "k-.", lw=1,
                label="reachable: max(t_forward + t_comm, t_local, CPU floor)")
        if "after_first_bucket_bound_ms" in rows[0]["variants"]["hvdkeras"]:
            ax.plot(rates, [x["variants"]["hvdkeras"]["after_first_bucket_bound_ms"] for x in rows], color="0.45",
                    lw=1, label="after the first bucket: max(t_first + t_comm, t_local)")
        for i, v in enumerate(v for v in (*KERAS3_VARIANTS, "horovod_keras2") if v in rows[0]["variants"]):
            med = [x["variants"][v]["step_ms"] for x in rows]
            lo = [m - x["variants"][v]["spread_ms"][0] for m, x in zip(med, rows)]
            hi = [x["variants"][v]["spread_ms"][1] - m for m, x in zip(med, rows)]
            ax.errorbar(rates, med, yerr=[lo, hi], marker="os^vDP"[i], capsize=3, label=LABELS[v])
        if rows[0]["t_local_keras2_ms"] is not None:
            ax.plot(rates, [x["t_local_keras2_ms"] for x in rows], color="C4", ls=":", lw=1, label="tf-keras t_local")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("link rate, Mbit/s (tbf, both directions)")
        ax.set_ylabel("ms per step (median of rounds; bars: min-max)")
        first = next(iter(links.values()))
        setting = threads_label(run["inter_op"], run.get("nice", "default"))
        ax.set_title(f"{model}, {setting}: {first['grad_bytes'] / 1e6:.1f} MB of gradients, "
                     f"t_local {first['t_local_ms']:.0f} ms", fontsize=10)
        ax.legend(fontsize=7)
    compute = "device-like compute (timed waits)" if results.get("compute") == "device" else "1 compute thread each"
    competing = f", {results['competing']} CPU-bound process(es) running" if results.get("competing") else ""
    fig.suptitle(f"hvdkeras over a shaped link: 2 test hosts, 1 worker each, {compute}{competing}, {results['date']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="500mbit,200mbit,50mbit",
                        help="comma-separated link rates as tc writes them (default: %(default)s)")
    parser.add_argument("--delay-ms", type=float, default=0.0,
                        help="one-way delay added to the link (needs tc netem; default: none)")
    parser.add_argument("--models", default="conv,mlp", help="conv, mlp or both (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per variant and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first")
    parser.add_argument("--sweep", default="", metavar="BYTES,...",
                        help="also time hvdkeras with each of these bucket_bytes (default: none)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in both workers, e.g. HOROVOD_CYCLE_TIME=5 or HVDKERAS_BUCKET_BYTES=0")
    parser.add_argument("--inter-op", default="1,0", metavar="N,...",
                        help="the workers' inter-op thread settings, each run in turn: 1 is the published "
                             "configuration, 0 TensorFlow's default (default: %(default)s)")
    parser.add_argument("--compute", choices=["cpu", "device"], default="cpu",
                        help="the models' compute: real (cpu), or device-like timed waits that take no core")
    parser.add_argument("--calibration", type=Path, default=None, metavar="JSON",
                        help="--compute device: wait the per-layer times of an earlier run (its network_device.json), "
                             "so that runs on different days wait the same; a model it lacks is timed here "
                             "(default: every model timed afresh)")
    parser.add_argument("--nice", default="default", metavar="SETTING,...",
                        help="HVDKERAS_HOROVOD_NICE settings, each run in turn: default, none or a value "
                             "(default: %(default)s)")
    parser.add_argument("--competing", type=int, default=0, metavar="N",
                        help="CPU-bound processes kept running on the machine throughout (default: 0)")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where the JSON and PNG go")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 steps, 1 round, no meaningful numbers")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per launch of the two workers")
    args = parser.parse_args(argv)
    rates = parse_rates(parser, args.rates)
    for model in args.models.split(","):
        if model not in ("conv", "mlp"):
            parser.error(f"--models takes conv and/or mlp. Received: {model!r}")
    settings = parse_inter_op(parser, args.inter_op)
    nices = parse_nice(parser, args.nice)
    if args.calibration is not None and args.compute != "device":
        parser.error(f"--calibration is for --compute device. Received: --compute {args.compute}")
    calibration = read_calibration(parser, args.calibration) if args.calibration is not None else {}
    if args.competing < 0:
        parser.error(f"--competing takes a count >= 0. Received: {args.competing}")
    env = parse_env(parser, args.env)
    args.env = env
    if args.quick:
        args.steps, args.rounds, args.warmup = 2, 1, 1
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        print("network_benchmark.py needs root, `ip` and `tc`: it makes two network namespaces and shapes the "
              f"link between them. Received: uid {os.geteuid()}, ip={shutil.which('ip')}, tc={shutil.which('tc')}",
              file=sys.stderr)
        return 2

    from netlab import LabHosts

    tmp = Path(tempfile.mkdtemp(prefix="hvdk-netbench-"))
    if calibration:  # the workers take the times of every model it holds, and time the others
        (tmp / "calibration.json").write_text(json.dumps(calibration))
    lab = LabHosts(tmp, subnet=78).start()
    results = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "quick": args.quick, "steps": args.steps, "rounds": args.rounds, "env": dict(env),
               "default_bucket_bytes": _default_bucket_bytes(), "sweep": args.sweep,
               "delay_ms": args.delay_ms, "compute": args.compute, "competing": args.competing, "links": {}}
    runs = {(inter_op, nice): {"inter_op": inter_op, "nice": nice, "models": {}}
            for inter_op in settings for nice in nices}
    results["runs"] = list(runs.values())
    port = 29710
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.competing)]
    try:
        for rate_name, nominal in rates:
            shape(lab, rate_name, args.delay_ms)
            tcp_s = lab.transfer(4_000_000)
            print(f"[{rate_name}] TCP transfer of 4 MB: {4e6 * 8 / tcp_s / 1e6:.0f} Mbit/s", flush=True)
            link = {"nominal_mbit_s": nominal / 1e6, "tcp_mbit_s": 4e6 * 8 / tcp_s / 1e6}
            for (inter_op, nice), run in runs.items():
                k3 = run_pair(lab, "keras3", tmp / f"k3-{rate_name}-{inter_op}-{nice}.json", port, args, args.timeout,
                              inter_op, nice)
                # Horovod's tf-keras integration: real compute only (there is no device-like stand-in for it).
                k2 = run_pair(lab, "keras2", tmp / f"k2-{rate_name}-{inter_op}-{nice}.json", port + 1, args,
                              args.timeout, inter_op, nice) if args.compute == "cpu" else None
                port += 2
                link.setdefault("frameworks", [k3[0]["framework"], *([k2[0]["framework"]] if k2 else [])])
                for model in args.models.split(","):
                    k3m, k2m = combine(k3, model), combine(k2, model) if k2 else None
                    if k3[0]["models"][model].get("calibration"):
                        run.setdefault("calibration", {})[model] = k3[0]["models"][model]["calibration"]
                    nbytes = k3[0]["models"][model]["grad_bytes"]
                    checked = check_link(rate_name, nominal, nbytes, k3m["link"]["median_ms"]) if not args.quick \
                        else {"allreduce_mbit_s": nbytes * 8 / k3m["link"]["median_ms"] * 1e-3}
                    link.setdefault(model, checked)
                    run["models"].setdefault(model, {})[rate_name] = summarize(k3m, k2m, nbytes)
                    s = run["models"][model][rate_name]
                    print(f"[{rate_name}, {threads_label(inter_op, nice)}] {model}: t_local {s['t_local_ms']:.0f} ms "
                          f"(forward {s['t_forward_ms']:.0f}, first bucket {s['t_first_bucket_ms']:.0f}), "
                          f"t_comm {s['t_comm_ms']:.0f} ms "
                          f"(fp16 {s['t_comm_fp16_ms']:.0f}), link allreduce {checked['allreduce_mbit_s']:.0f} "
                          f"Mbit/s, CPU per step local {s['cpu_local_ms']:.0f} ms (waiting for a core "
                          f"{s['wait_local_ms']:.0f}), comm {s['cpu_comm_ms']:.0f} ms; "
                          + ", ".join(f"{v} {d['step_ms']:.0f} ms (overlap {d['overlap']:.2f}, after forward "
                                      f"{d['overlap_after_forward']:.2f}, reachable {d['reachable_bound_ms']:.0f} ms "
                                      f"{d['vs_reachable_bound']:+.0%}, after first bucket "
                                      f"{d['after_first_bucket_bound_ms']:.0f} ms "
                                      f"{d['vs_after_first_bucket_bound']:+.1%}, CPU {d['cpu_ms']:.0f} ms, "
                                      f"waiting for a core "
                                      f"{d['wait_ms']:.0f} ms, "
                                      f"eff {d['scaling_efficiency']:.2f})"
                                      for v, d in s["variants"].items()),
                          flush=True)
            results["links"][rate_name] = link
    except LinkError as e:
        print(f"network_benchmark.py: {e}", file=sys.stderr)
        return 3
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "network_device" if args.compute == "device" else "network_benchmark"
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / f"{name}.png")
    print(f"wrote {args.out / f'{name}.json'} and {args.out / f'{name}.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
