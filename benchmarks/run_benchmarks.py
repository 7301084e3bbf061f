"""hvdkeras benchmarks, measured side by side in one run on this machine; writes JSON + a PNG plot.

    .venv/bin/python benchmarks/run_benchmarks.py [--quick] [--out DIR]      (`make bench`)

1. Overhead: step time of hvdkeras `fit` vs a raw Horovod custom loop (DistributedGradientTape + the plain
   Keras optimizer), and vs Horovod's own Keras integration on the legacy Keras 2 path (tf-keras), 2 workers.
2. Scaling: throughput of 2 workers vs 1 on a compute-bound CNN, one thread per worker.
3. Gradient path: hvdkeras's reduction of 1/16/64 MB vs horovod.tensorflow.allreduce of the same bytes,
   with and without fp16, and an in-memory copy as the machine's ceiling.
4. Time to accuracy on digits: 1 worker at batch B vs 2 workers at batch B each (linear scaling, warm-up).
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BIN = Path(sys.executable).parent


def launch(np_: int, argv: list, out_json: Path, timeout: float, env: dict | None = None) -> dict:
    cmd = [str(BIN / "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", sys.executable, *argv]
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=str(REPO))
    if proc.returncode != 0 or not out_json.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise RuntimeError(f"benchmark step failed ({' '.join(argv[:3])}):\n{tail}")
    return json.loads(out_json.read_text())


def worker(mode: str, np_: int, tmp: Path, quick: bool, env: dict | None = None, timeout: float = 900) -> dict:
    out = tmp / f"{mode}-{np_}.json"
    argv = [str(HERE / "bench_worker.py"), mode, str(out)] + (["--quick"] if quick else [])
    return launch(np_, argv, out, timeout, env)


def plain_concurrent(n: int, tmp: Path, quick: bool) -> float:
    """Total images/s of n independent single-thread processes without Horovod, run at the same time."""
    outs = [tmp / f"plain-{n}-{i}.json" for i in range(n)]
    procs = [subprocess.Popen([sys.executable, str(HERE / "bench_worker.py"), "scaling-plain", str(out)]
                              + (["--quick"] if quick else []), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), cwd=str(REPO)) for out in outs]
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"scaling-plain failed:\n{err.decode()[-3000:]}")
    return sum(json.loads(out.read_text())["images_per_s_per_worker"] for out in outs)


def digits(np_: int, tmp: Path, epochs: int) -> dict:
    out = tmp / f"digits-{np_}.json"
    argv = [str(REPO / "examples" / "keras_digits.py"), "--epochs", str(epochs), "--out-dir", str(tmp / f"d{np_}"),
            "--history-out", str(out)]
    return launch(np_, argv, out, timeout=900)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    o = results["overhead"]
    names = [k for k in ("hvdkeras_fit", "raw_horovod_loop", "horovod_keras2_fit") if k in o["step_ms"]]
    axes[0, 0].bar(names, [o["step_ms"][k] for k in names], color=["C0", "C1", "C2"][: len(names)])
    axes[0, 0].set_ylabel("ms per step (median)")
    axes[0, 0].set_title("1. Step time, 2 workers (MLP 784-512-512-10, batch 64/worker)", fontsize=10)
    s = results["scaling"]
    axes[0, 1].bar(["1 worker", "2 workers", "1 process\nno Horovod", "2 processes\nno Horovod"],
                   [s["images_per_s_1"], s["images_per_s_2"], s["no_horovod_images_per_s_1"],
                    s["no_horovod_images_per_s_2_concurrent"]], color=["C1", "C0", "C7", "C7"])
    axes[0, 1].set_ylabel("images/s")
    axes[0, 1].set_title(f"2. Scaling (CNN, 1 thread each): efficiency {s['efficiency']:.2f}, "
                         f"machine ceiling {s['machine_ceiling_efficiency']:.2f}", fontsize=10)
    g = results["gradpath"]
    sizes = list(g)
    width = 0.13
    bars = (("hvdkeras_none_s", "hvdkeras (4 tensors)"), ("horovod_grouped_none_s", "horovod grouped (4 tensors)"),
            ("horovod_none_s", "horovod allreduce (1 tensor)"), ("hvdkeras_fp16_s", "hvdkeras fp16"),
            ("horovod_fp16_s", "horovod fp16 (1 tensor)"), ("memcpy_s", "memory copy"))
    for i, (key, label) in enumerate(bars):
        axes[1, 0].bar([j + (i - 2.5) * width for j in range(len(sizes))], [g[m][key] * 1e3 for m in sizes],
                       width, label=label)
    axes[1, 0].set_xticks(range(len(sizes)), [f"{m} MB" for m in sizes])
    axes[1, 0].set_ylabel("ms (median)")
    axes[1, 0].set_yscale("log")
    axes[1, 0].set_title("3. Gradient reduction, 2 workers")
    axes[1, 0].legend(fontsize=7, loc="upper left")
    t = results["time_to_accuracy"]
    for key, label in (("val_accuracy_1", "1 worker, batch 32, lr 1e-3"),
                       ("val_accuracy_2", "2 workers, batch 32 each, lr 2e-3 + warm-up")):
        axes[1, 1].plot(range(1, len(t[key]) + 1), t[key], marker="o", label=label)
    axes[1, 1].set_xlabel("epoch")
    axes[1, 1].set_ylabel("validation accuracy")
    axes[1, 1].set_title("4. Time to accuracy on digits")
    axes[1, 1].legend(fontsize=8)
    fig.suptitle(f"hvdkeras benchmarks, {results['date']}, {results['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def independent(launches: dict, at_once: bool) -> dict:
    """Runs independent launches (name -> function) one after the other, or all at the same time."""
    if not at_once:
        return {name: launch() for name, launch in launches.items()}
    with concurrent.futures.ThreadPoolExecutor(len(launches)) as pool:
        futures = {name: pool.submit(launch) for name, launch in launches.items()}
        return {name: future.result() for name, future in futures.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, no meaningful numbers)")
    parser.add_argument("--out", default=str(HERE / "results"), help="where bench.json and bench.png go")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Gloo on localhost",
        "quick": args.quick,
    }
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        # A smoke run does the 2-worker Keras 3 measurements in one launch; a real run gives each its own.
        joint = worker("overhead-hvdkeras+overhead-raw+idle+gradpath+scaling", 2, tmp, True) if args.quick else {}

        def measured(mode):
            return joint[mode] if mode in joint else worker(mode, 2, tmp, args.quick)

        # Alternate the jobs over several rounds (this machine drifts); the median of the rounds counts.
        rounds = 1 if args.quick else 3
        runs: dict = {"hvdkeras_fit": [], "raw_horovod_loop": []}
        for _ in range(rounds):
            runs["hvdkeras_fit"].append(measured("overhead-hvdkeras")["step_s"] * 1e3)
            runs["raw_horovod_loop"].append(measured("overhead-raw")["step_s"] * 1e3)
        step_ms = {name: statistics.median(values) for name, values in runs.items()}
        epochs = 2 if args.quick else 12

        def keras2():
            try:
                return worker("overhead-keras2", 2, tmp, args.quick, env={"TF_USE_LEGACY_KERAS": "1"})
            except RuntimeError as err:  # tf-keras missing: report, keep the other figures
                return {"error": str(err).splitlines()[-1]}

        # These launches are independent. A real run times them one by one; a smoke run, whose figures mean
        # nothing, starts them all at once.
        done = independent({"keras2": keras2, "one": lambda: worker("scaling", 1, tmp, args.quick),
                            "plain1": lambda: plain_concurrent(1, tmp, args.quick),
                            "plain2": lambda: plain_concurrent(2, tmp, args.quick),
                            "digits1": lambda: digits(1, tmp, epochs), "digits2": lambda: digits(2, tmp, epochs)},
                           at_once=args.quick)
        if "error" in done["keras2"]:
            results["horovod_keras2_error"] = done["keras2"]["error"]
        else:
            step_ms["horovod_keras2_fit"] = done["keras2"]["step_s"] * 1e3
        overhead = {"step_ms": step_ms, "rounds_ms": runs,
                    "hvdkeras_over_raw": step_ms["hvdkeras_fit"] / step_ms["raw_horovod_loop"]}
        if "horovod_keras2_fit" in step_ms:
            overhead["hvdkeras_over_horovod_keras2"] = step_ms["hvdkeras_fit"] / step_ms["horovod_keras2_fit"]
        results["overhead"] = overhead
        one = done["one"]
        two = measured("scaling")
        plain1, plain2 = done["plain1"], done["plain2"]
        results["scaling"] = {
            "images_per_s_1": one["images_per_s_total"],
            "images_per_s_2": two["images_per_s_total"],
            "efficiency": two["images_per_s_total"] / (2 * one["images_per_s_total"]),
            # The same training in 1 and in 2 independent processes, no Horovod: what the machine allows.
            "no_horovod_images_per_s_1": plain1,
            "no_horovod_images_per_s_2_concurrent": plain2,
            "machine_ceiling_efficiency": plain2 / (2 * plain1),
            # Share of one core Horovod's background thread burns per process with nothing to do.
            "horovod_idle_cpu_fraction": measured("idle")["idle_cpu_fraction"],
        }
        grad = measured("gradpath")
        for row in grad.values():
            for label in ("none", "fp16"):
                row[f"ratio_{label}"] = row[f"hvdkeras_{label}_s"] / row[f"horovod_{label}_s"]
                row[f"ratio_grouped_{label}"] = row[f"hvdkeras_{label}_s"] / row[f"horovod_grouped_{label}_s"]
        results["gradpath"] = grad
        h1, h2 = done["digits1"], done["digits2"]
        results["time_to_accuracy"] = {
            "val_accuracy_1": h1["val_accuracy"],
            "val_accuracy_2": h2["val_accuracy"],
            # Does 2 workers' accuracy reach 1 worker's final accuracy (within 1 point) in as many epochs?
            "two_workers_reach_one_worker_final": h2["val_accuracy"][-1] >= h1["val_accuracy"][-1] - 0.01,
        }
    (out / "bench.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "bench.png")
    print(json.dumps(results, indent=1))
    print(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
