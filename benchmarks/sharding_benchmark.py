"""shard_optimizer_state=True against the unsharded DistributedOptimizer, side by side in one run, on this host.

    python benchmarks/sharding_benchmark.py [--out docs] [--limit-gib 2.5] [--hosts 200mbit]
                                                         (make shardbench: all three parts, hosts at 200 Mbit/s)

1. An MLP of 8 x Dense(3584) (103M parameters) with Adam, at N = 1, 2 and 4 workers, each way: per worker, the
   bytes of optimizer state counted from its variables, its peak resident memory, and the median step time.
2. The largest such MLP (8 layers, width searched in steps of 256) that trains at N = 2 when each worker is
   held to --limit-gib by a memory cgroup (v1, needs root), each way.
3. With --hosts RATE (needs root, ip and tc): the step time on the two test hosts (network namespaces joined
   by a veth pair shaped to RATE with tc tbf, as in benchmarks/network_benchmark.py), one worker on each, an
   MLP of 8 x Dense(--hosts-width), each way twice, interleaved.

Writes OUT/sharding_benchmark.json and OUT/sharding_benchmark.png and prints the ratios. --only-hosts runs the
third part alone and only prints it.
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

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "benchmarks" / "sharding_worker.py"
BIN = Path(sys.executable).parent
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
LAYERS = 8


def _env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                PYTHONPATH=str(REPO))


def launch(n: int, script: Path, args: list[str], timeout: float = 600, may_fail: bool = False) -> list | None:
    """Runs `script OUT *args` on n workers of this host (horovodrun over Gloo) and returns each rank's
    OUT/rank<r>.json, in rank order. A failed job exits with its output, or returns None when `may_fail`."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [str(BIN / "horovodrun"), "-np", str(n), "-H", f"localhost:{n}", "--gloo", sys.executable,
               str(script), out, *args]
        done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
        paths = sorted(Path(out).glob("rank*.json"))
        if done.returncode != 0 or len(paths) != n:
            if not may_fail:
                raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-6000:]}")
            return None
        return [json.loads(p.read_text()) for p in paths]


def run(n: int, width: int, shard: bool, steps: int, cgroup: str | None = None, timeout: float = 600,
        extra: tuple[str, ...] = ()) -> list | None:
    """Each rank's measurements, or None when the job failed (with a cgroup: a worker ran out of memory).
    `extra`: more of the worker's arguments (--model, --batch, --whole)."""
    args = ["--width", str(width), "--layers", str(LAYERS), "--steps", str(steps), *extra]
    args += ["--shard"] if shard else []
    args += ["--cgroup", cgroup] if cgroup else []
    return launch(n, WORKER, args, timeout=timeout, may_fail=cgroup is not None)


def memory_table(steps: int) -> list[dict]:
    rows = []
    for n in (1, 2, 4):
        for shard in (False, True):
            ranks = run(n, 3584, shard, steps)
            rows.append({"workers": n, "sharded": shard, "params": ranks[0]["params"],
                         "optimizer_state_bytes": max(r["optimizer_state_bytes"] for r in ranks),
                         "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks),
                         "steps_peak_rss_bytes": max(r["steps_peak_rss_bytes"] for r in ranks),
                         "step_seconds": max(r["step_seconds"] for r in ranks)})
            row = rows[-1]
            side = "sharded  " if shard else "unsharded"
            print(f"N={n} {side}: optimizer state {row['optimizer_state_bytes'] / 2**20:7.1f}"
                  f" MiB, peak RSS {row['peak_rss_bytes'] / 2**30:5.2f} GiB (steps: "
                  f"{row['steps_peak_rss_bytes'] / 2**30:5.2f}), step {row['step_seconds']:.3f} s", flush=True)
    return rows


def _cgroups(limit: int, n: int) -> str:
    base = CGROUP_ROOT / f"hvdkeras-bench-{os.getpid()}"
    for rank in range(n):
        path = Path(f"{base}-{rank}")
        path.mkdir(exist_ok=True)
        (path / "memory.limit_in_bytes").write_text(str(limit))
    return str(base)


def _remove_cgroups(base: str, n: int) -> None:
    for rank in range(n):
        for _ in range(50):
            try:
                os.rmdir(f"{base}-{rank}")
                break
            except FileNotFoundError:
                break
            except OSError:  # its processes are still exiting
                time.sleep(0.1)


def largest_model(limit_gib: float, shard: bool) -> dict:
    """Bisects the width (in steps of 256) of the largest MLP that trains 3 steps at N = 2 under the limit."""
    limit = int(limit_gib * 2**30)
    base = _cgroups(limit, 2)
    try:
        lo, hi = 4, 40  # widths 1024 .. 10240, in units of 256
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2
            ranks = run(2, mid * 256, shard, 3, cgroup=base)
            ok = ranks is not None and all(r["loss_finite"] for r in ranks)
            print(f"  limit {limit_gib} GiB, {'sharded' if shard else 'unsharded'}, width {mid * 256}: "
                  f"{'trains' if ok else 'killed'}", flush=True)
            if ok:
                best = {"width": mid * 256, "params": ranks[0]["params"],
                        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks)}
                lo = mid + 1
            else:
                hi = mid - 1
        return best or {"width": None, "params": 0}
    finally:
        _remove_cgroups(base, 2)


def on_hosts(rate: str, width: int, steps: int) -> dict:
    """Median step time, sharded and unsharded, one worker on each of the two test hosts over RATE."""
    from network_benchmark import run_on_hosts, shape

    from netlab import LabHosts

    tmp = Path(tempfile.mkdtemp(prefix="hvdk-shardbench-"))
    lab = LabHosts(tmp, subnet=79).start()
    result: dict = {"rate": rate, "width": width, "layers": LAYERS, "steps": steps}
    try:
        shape(lab, rate, 0)
        for k, shard in enumerate((False, True, False, True)):  # interleaved: each way twice
            out = tmp / f"run{k}"
            out.mkdir()
            argv = [str(WORKER), str(out), "--width", str(width), "--layers", str(LAYERS), "--steps", str(steps),
                    *(["--shard"] if shard else [])]
            run_on_hosts(lab, argv, out, 29810 + k, timeout=900, what="sharding")
            ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
            side = "sharded" if shard else "unsharded"
            result.setdefault(side, []).append(max(r["step_seconds"] for r in ranks))
            result["params"] = ranks[0]["params"]
            print(f"hosts at {rate}: {side}, step {result[side][-1]:.3f} s", flush=True)
    finally:
        lab.stop()
    result["ratio"] = min(result["sharded"]) / min(result["unsharded"])
    return result


def plot(rows: list[dict], largest: dict, hosts: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4 if hosts else 3, figsize=(17 if hosts else 13, 4))
    for ax, key, scale, label in ((axes[0], "optimizer_state_bytes", 2**20, "optimizer state per worker (MiB)"),
                                  (axes[1], "steps_peak_rss_bytes", 2**30, "peak resident memory per worker\n"
                                                                           "during the steps (GiB)"),
                                  (axes[2], "step_seconds", 1, "step time (s)")):
        for k, shard in enumerate((False, True)):
            sel = [r for r in rows if r["sharded"] is shard]
            ax.bar([i + 0.4 * k for i in range(len(sel))], [r[key] / scale for r in sel], width=0.4,
                   label="sharded" if shard else "unsharded")
        ax.set_xticks([i + 0.2 for i in range(3)], [f"N={r['workers']}" for r in rows if not r["sharded"]])
        ax.set_title(label, fontsize=10)
    axes[0].legend()
    if hosts:
        ax = axes[3]
        for k, side in enumerate(("unsharded", "sharded")):
            ax.bar([j + 0.4 * k for j in range(len(hosts[side]))], hosts[side], width=0.4, label=side)
        ax.set_xticks([j + 0.2 for j in range(len(hosts["sharded"]))],
                      [f"run {j + 1}" for j in range(len(hosts["sharded"]))])
        ax.set_title(f"step time (s), 2 hosts at {hosts['rate']}, N=2\n"
                     f"MLP 8 x Dense({hosts['width']}): sharded {hosts['ratio']:.2f}x", fontsize=10)
    ratio = largest["ratio"]
    fig.suptitle(f"Adam, MLP 8 x Dense(3584), 103M parameters; largest model under {largest['limit_gib']} GiB per "
                 f"worker at N=2: {ratio:.2f}x the parameters sharded", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--limit-gib", type=float, default=2.5)
    parser.add_argument("--hosts", default=None, help="also time both ways on the two test hosts at this rate")
    parser.add_argument("--hosts-width", type=int, default=768)
    parser.add_argument("--only-hosts", action="store_true", help="only the two test hosts' part")
    args = parser.parse_args()
    if args.only_hosts and not args.hosts:
        parser.error("--only-hosts needs --hosts RATE. Received: --hosts not given")
    if args.only_hosts:
        hosts = on_hosts(args.hosts, args.hosts_width, args.steps)
        print(f"hosts at {args.hosts}: sharded / unsharded step time {hosts['ratio']:.3f}")
        return
    if os.geteuid() != 0 or not CGROUP_ROOT.is_dir():
        raise SystemExit("the largest-model part needs root and the v1 memory cgroup at /sys/fs/cgroup/memory")
    started = time.time()
    rows = memory_table(args.steps)
    largest = {"limit_gib": args.limit_gib}
    for shard in (False, True):
        largest["sharded" if shard else "unsharded"] = largest_model(args.limit_gib, shard)
    largest["ratio"] = largest["sharded"]["params"] / max(largest["unsharded"]["params"], 1)
    hosts = on_hosts(args.hosts, args.hosts_width, args.steps) if args.hosts else None
    by = {(r["workers"], r["sharded"]): r for r in rows}
    ratios = {f"N={n}": {
        "optimizer_state": by[(n, True)]["optimizer_state_bytes"] / by[(n, False)]["optimizer_state_bytes"],
        "peak_rss": by[(n, True)]["peak_rss_bytes"] / by[(n, False)]["peak_rss_bytes"],
        "steps_peak_rss": by[(n, True)]["steps_peak_rss_bytes"] / by[(n, False)]["steps_peak_rss_bytes"],
        "step_time": by[(n, True)]["step_seconds"] / by[(n, False)]["step_seconds"]} for n in (1, 2, 4)}
    for n, r in ratios.items():
        print(f"{n}: sharded / unsharded: optimizer state {r['optimizer_state']:.3f}, peak RSS {r['peak_rss']:.3f} "
              f"(steps {r['steps_peak_rss']:.3f}), step time {r['step_time']:.3f}")
    print(f"largest model under {args.limit_gib} GiB per worker at N=2: unsharded {largest['unsharded']['params']:,}"
          f" parameters, sharded {largest['sharded']['params']:,}: {largest['ratio']:.2f}x")
    if hosts:
        print(f"hosts at {args.hosts}: sharded / unsharded step time {hosts['ratio']:.3f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"date": datetime.date.today().isoformat(), "host": f"{os.cpu_count()} cores",
              "seconds": round(time.time() - started), "model": f"MLP {LAYERS} x Dense(3584), Adam",
              "rows": rows, "ratios": ratios, "largest_model": largest, "hosts": hosts}
    (out / "sharding_benchmark.json").write_text(json.dumps(report, indent=1))
    plot(rows, largest, hosts, out / "sharding_benchmark.png")


if __name__ == "__main__":
    main()
