"""Running a training function on Spark: `hvdkeras.spark.run`, with `horovod.spark.run`'s parameters.

    results = hvdkeras.spark.run(train, args=(epochs,), num_proc=4)   # train(epochs) on 4 Spark tasks

The function runs in the tasks of one Spark barrier stage, all started together. Each task's partition id is
its rank. Rank 0 picks a free port on its host and tells the others through the barrier context
(`allGather`); each task then starts `fn` in a fresh Python process with the variables hvdkeras's
rendezvous reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, HVDKERAS_JOB_ID),
so the `hvdkeras.init()` inside `fn` forms one job. The fresh process keeps TensorFlow and Horovod out of
Spark's reused Python workers, and ends with its task (PR_SET_PDEATHSIG).

A task whose `fn` raises (or whose process dies) does not fail the stage, which Spark would retry: it
returns the error, the other ranks fail within the stall timeout when they lose it, and `run` raises on
the driver with the error of the rank that failed first. Needs `pip install hvdkeras[spark]`.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from hvdkeras.job.launchers import split_address
from hvdkeras.settings import variable

DEFAULT_START_TIMEOUT = 600  # seconds, as horovod.spark.run (HOROVOD_SPARK_START_TIMEOUT)


class SparkJobError(RuntimeError):
    """A rank of an `hvdkeras.spark.run` job failed; the message holds that rank's error."""


def run(fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None, num_proc: int | None = None,
        start_timeout: float | None = None, use_mpi: bool | None = None, use_gloo: bool | None = None,
        extra_mpi_args: str | None = None, env: dict | None = None, stdout: Any = None, stderr: Any = None,
        verbose: int = 1, nics: Any = None, prefix_output_with_timestamp: bool = False,
        executable: str | None = None) -> list:
    """Runs `fn(*args, **kwargs)` on `num_proc` Spark tasks that form one hvdkeras job.

    Args:
        fn: the function to run; it calls `hvdkeras.init()` and trains. Pickled with cloudpickle.
        args: positional arguments for `fn`.
        kwargs: keyword arguments for `fn`.
        num_proc: number of processes (Spark tasks); defaults to `spark.default.parallelism`.
        start_timeout: seconds to wait for enough task slots and for the job to form; defaults to
            $HOROVOD_SPARK_START_TIMEOUT, else 600.
        use_mpi: only False or None: hvdkeras's job runs on Gloo.
        use_gloo: True or None.
        extra_mpi_args: only None (no MPI).
        env: variables to set in every rank's process, on top of the executor's environment.
        stdout: when given, each rank's output is written to it (prefixed `[rank]<stdout>:`) once the job
            ends; otherwise it is streamed, prefixed, to the executors' own output.
        stderr: the same for the error output.
        verbose: 0 prints nothing on the driver; 1 (default) says what was started.
        nics: network interfaces for Gloo; one interface name (HVDKERAS_IFACE).
        prefix_output_with_timestamp: put a timestamp before each forwarded line.
        executable: the Python interpreter for the ranks' processes; defaults to the executors' own.

    Returns:
        `fn`'s results, ordered by rank.

    Raises:
        ValueError: a bad argument, or more processes than the cluster has task slots after `start_timeout`.
        RuntimeError: no active SparkContext.
        SparkJobError: a rank failed; the message is that rank's traceback.

    Example:
        >>> hvdkeras.spark.run(train, args=(5,), num_proc=2)
        [history_of_rank_0, history_of_rank_1]
    """
    import cloudpickle
    import pyspark

    kwargs = dict(kwargs or {})
    if use_mpi:
        raise ValueError("hvdkeras.spark.run forms a Gloo job; MPI is not used. Received: use_mpi=True")
    if use_gloo is False:
        raise ValueError("hvdkeras.spark.run forms a Gloo job. Received: use_gloo=False")
    if extra_mpi_args:
        raise ValueError(f"hvdkeras.spark.run uses no MPI. Received: extra_mpi_args={extra_mpi_args!r}")
    iface = _one_nic(nics)
    if start_timeout is None:
        start_timeout = float(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", DEFAULT_START_TIMEOUT))
    sc = pyspark.SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("hvdkeras.spark.run needs an active SparkContext: create a SparkSession first "
                           "(SparkSession.builder.getOrCreate()).")
    if num_proc is None:
        num_proc = sc.defaultParallelism
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"`num_proc` must be an integer >= 1. Received: num_proc={num_proc!r}")
    _wait_for_slots(sc, num_proc, start_timeout)
    payload = cloudpickle.dumps((fn, tuple(args), kwargs))
    settings = {"env": dict(env or {}), "iface": iface, "timeout": float(start_timeout), "executable": executable,
                "timestamps": bool(prefix_output_with_timestamp), "collect": stdout is not None or stderr is not None,
                "job": f"spark-{sc.applicationId}-{time.time_ns()}"}
    if verbose:
        print(f"hvdkeras.spark.run: {num_proc} processes in one barrier stage", file=sys.stderr, flush=True)

    def task(_):
        return [_run_rank(payload, settings)]

    results = sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(task).collect()
    results.sort(key=lambda r: r["rank"])
    for stream, key in ((stdout, "stdout"), (stderr, "stderr")):
        if stream is not None:
            for r in results:
                stream.write(r.get(key, ""))
    failed = sorted((r for r in results if r["error"] is not None), key=lambda r: r["failed_at"])
    if failed:
        first = failed[0]
        others = ", ".join(str(r["rank"]) for r in failed[1:])
        raise SparkJobError(f"rank {first['rank']} of {num_proc} failed first"
                            f"{f' (then ranks {others})' if others else ''}:\n{first['error']}")
    return [cloudpickle.loads(r["value"]) for r in results]


def _one_nic(nics: Any) -> str | None:
    if nics is None:
        return None
    names = [nics] if isinstance(nics, str) else sorted(nics)
    if len(names) != 1:
        raise ValueError(f"hvdkeras.spark.run uses one network interface for Gloo. Received: nics={nics!r}")
    return names[0]


def _slots(sc) -> int:
    cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    return max(sc.defaultParallelism // cpus, 0)


def _wait_for_slots(sc, num_proc: int, start_timeout: float) -> None:
    """A barrier stage starts only when every task has a slot: wait for enough, within the bound."""
    deadline = time.monotonic() + start_timeout
    while _slots(sc) < num_proc:
        if time.monotonic() >= deadline:
            raise ValueError(
                f"hvdkeras.spark.run asked for {num_proc} processes, but this Spark cluster has {_slots(sc)} task "
                f"slots (spark.default.parallelism / spark.task.cpus) after {start_timeout:g} s. A barrier stage "
                f"runs all its tasks at once: give the cluster more cores, or ask for fewer processes. Received: "
                f"num_proc={num_proc}")
        time.sleep(0.5)


# ------------------------------------------------------------------------------------------ on the executors
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _run_rank(payload: bytes, settings: dict) -> dict:
    """One barrier task: find the job, run `fn` in a fresh process, return its result or its error."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    hosts = [split_address(info.address)[0] for info in ctx.getTaskInfos()]
    ports = ctx.allGather(str(_free_port()) if rank == 0 else "")
    environ = {**os.environ, **settings["env"],
               "RANK": str(rank), "WORLD_SIZE": str(len(hosts)),
               "LOCAL_RANK": str(hosts[:rank].count(hosts[rank])), "LOCAL_WORLD_SIZE": str(hosts.count(hosts[rank])),
               "MASTER_ADDR": hosts[0], "MASTER_PORT": ports[0],
               variable("job_id"): f"{settings['job']}-{ctx.stageId()}",
               variable("rendezvous_timeout"): str(settings["timeout"])}
    for name in ("HOROVOD_RANK", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "TF_CONFIG", "TORCHELASTIC_USE_AGENT_STORE"):
        environ.pop(name, None)  # nothing from an outer launcher
    if settings["iface"]:
        environ[variable("iface")] = settings["iface"]
    result: dict = {"rank": rank, "error": None, "value": None, "failed_at": None, "stdout": "", "stderr": ""}
    with tempfile.TemporaryDirectory(prefix="hvdkeras-spark-") as tmp:
        job_file, result_file = os.path.join(tmp, "fn.pkl"), os.path.join(tmp, "result.pkl")
        with open(job_file, "wb") as f:
            f.write(payload)
        proc = subprocess.Popen([settings["executable"] or sys.executable, "-m", "hvdkeras.engines.spark", job_file,
                                 result_file], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_die_with_parent, text=True, errors="replace")
        forwarders = [threading.Thread(target=_forward, args=(pipe, rank, name, settings, result), daemon=True)
                      for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
        for thread in forwarders:
            thread.start()
        code = proc.wait()
        for thread in forwarders:
            thread.join()
        if os.path.exists(result_file):
            with open(result_file, "rb") as f:
                status, value, failed_at = pickle.load(f)
            if status == "ok":
                result["value"] = value
            else:
                result.update(error=value, failed_at=failed_at)
        else:
            result.update(error=f"rank {rank}'s process exited with code {code} before returning",
                          failed_at=time.time())
    return result


def _forward(pipe, rank: int, name: str, settings: dict, result: dict) -> None:
    out = sys.stdout if name == "stdout" else sys.stderr
    for line in pipe:
        stamp = time.strftime("%a %b %d %H:%M:%S %Y ") if settings["timestamps"] else ""
        text = f"{stamp}[{rank}]<{name}>:{line}"
        if settings["collect"]:
            result[name] += text
        else:
            out.write(text)
            out.flush()


def _die_with_parent() -> None:
    # The rank's process ends with the Spark task that started it, even when the task is killed.
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _child(job_file: str, result_file: str) -> int:
    """The rank's own process: runs `fn` and writes ("ok", pickled result) or ("error", traceback, time)."""
    import traceback

    import cloudpickle

    with open(job_file, "rb") as f:
        fn, args, kwargs = cloudpickle.loads(f.read())
    try:
        outcome = ("ok", cloudpickle.dumps(fn(*args, **kwargs)), None)
    except BaseException:  # noqa: BLE001 - reported to the driver as this rank's error
        outcome = ("error", traceback.format_exc(), time.time())
    with open(result_file + ".tmp", "wb") as f:
        pickle.dump(outcome, f)
    os.replace(result_file + ".tmp", result_file)
    return 0 if outcome[0] == "ok" else 1


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))
