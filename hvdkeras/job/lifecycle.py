"""The job's life: forming it from the launcher's environment, starting Horovod (its threads' priority and
cycle time), pinning the process's GPU, restarting it for elastic resets, and stopping it."""

from __future__ import annotations

import logging
import os
from typing import Any

import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.job import launchers, rendezvous, threads

log = logging.getLogger("hvdkeras")


_said_no_gpu: list[bool] = []


def pin_gpu(local_rank: int, local_size: int | None = None, config: Any = None, environ: Any = None,
            built_with_cuda: bool | None = None) -> Any:
    """Makes exactly one GPU visible to this process: the GPU of its local rank.

    A process that already chose its devices is left alone: its TensorFlow was told which GPUs to see
    (`tf.config.set_visible_devices` before `init()`), or its launcher gave it one GPU
    (CUDA_VISIBLE_DEVICES naming a single device, as Slurm's GPU binding does). A CUDA build of TensorFlow
    that sees no GPU trains on CPU, and says so once.

    Args:
        local_rank: this process's rank on its host.
        local_size: the processes on this host; defaults to `local_rank + 1` (nothing to check).
        config: the `tf.config` module (replaceable in tests).
        environ: the environment (default `os.environ`).
        built_with_cuda: whether TensorFlow is a CUDA build (default: asked of TensorFlow).

    Returns:
        The physical device that was pinned, or None when none was (no GPU, or the process chose).

    Raises:
        ValueError: more processes on this host than GPUs, which would put two processes on one GPU.
    """
    config = tf.config if config is None else config
    environ = os.environ if environ is None else environ
    gpus = config.list_physical_devices("GPU")
    if not gpus:
        cuda = tf.test.is_built_with_cuda() if built_with_cuda is None else built_with_cuda
        if cuda and not _said_no_gpu:
            _said_no_gpu.append(True)
            log.warning("hvdkeras: TensorFlow is a CUDA build but sees no GPU: training on CPU")
        return None
    chosen = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if len(chosen) == 1 or len(config.get_visible_devices("GPU")) != len(gpus):
        log.info("hvdkeras: this process chose its GPUs (%s): left as they are",
                 f"CUDA_VISIBLE_DEVICES={chosen[0]}" if len(chosen) == 1 else "tf.config.set_visible_devices")
        return None
    local_size = local_rank + 1 if local_size is None else local_size
    if local_size > len(gpus):
        raise ValueError(
            f"{local_size} processes on this host but {len(gpus)} GPUs visible: each process needs a GPU of its "
            f"own (two on one GPU would share its memory and compute). Start at most {len(gpus)} processes per "
            "host, or make CUDA_VISIBLE_DEVICES give each process its GPU, or pass init(pin_gpus=False). "
            f"Received: local size {local_size}, GPUs {[getattr(g, 'name', g) for g in gpus]}"
        )
    gpu = gpus[local_rank]
    try:
        config.set_visible_devices(gpu, "GPU")
        # Grow memory on demand, so the processes sharing a host never grab each other's GPU memory.
        config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as err:  # the TF runtime was already initialized by the script
        log.warning("hvdkeras: could not pin GPU %s for local rank %d: %s", gpu, local_rank, err)
    return gpu


# Horovod's background thread coordinates the ranks once per cycle (HOROVOD_CYCLE_TIME, Horovod's default
# 1 ms). Across hosts every cycle is network traffic and CPU on the hosts; measured on the two-host lab at
# 200 Mbit/s, 5 ms made the bucketed fit 8-13% faster than 1 ms (10 and 20 ms were no better than 5), and at
# 1 Gbit/s no slower. On one host Horovod's default stays.
MULTI_HOST_CYCLE_TIME_MS = "5"


def _spans_hosts(environ: Any) -> bool:
    try:
        # Horovod's own variable: whatever else it holds, Horovod itself reports it.
        return int(environ.get("HOROVOD_CROSS_SIZE", "1")) > 1
    except ValueError:
        return False


def horovod_defaults(environ: Any, spans_hosts: bool | None = None) -> dict[str, str]:
    """The Horovod settings hvdkeras adds before Horovod starts: HOROVOD_CYCLE_TIME=5 (ms) when the job spans
    hosts and it is unset. Anything the user or horovodrun set stays.

    Args:
        environ: the environment Horovod will read.
        spans_hosts: whether the job spans hosts; None reads HOROVOD_CROSS_SIZE > 1 (a job horovodrun formed).
    """
    spans_hosts = _spans_hosts(environ) if spans_hosts is None else spans_hosts
    if spans_hosts and not environ.get("HOROVOD_CYCLE_TIME", "").strip():
        return {"HOROVOD_CYCLE_TIME": MULTI_HOST_CYCLE_TIME_MS}
    return {}


def _start_horovod(comm: Any, process_sets: Any, formed: rendezvous.Formed | None = None) -> list[int]:
    """Starts Horovod; returns the ids of its threads that were given the nice value (see _threads).

    `formed`: the job hvdkeras's rendezvous formed, whose facts (does it span hosts, over Gloo) decide the
    priority and cycle time; None for a job horovodrun (or MPI) formed, whose facts are in Horovod's variables.
    """
    spans = formed.cross_size > 1 if formed is not None else _spans_hosts(os.environ)
    # A bad nice value fails before the start.
    nice = threads.horovod_nice(os.environ, spans, gloo=True if formed is not None else None)
    defaults = horovod_defaults(os.environ, spans)
    if defaults:
        log.info("hvdkeras: the job spans hosts: %s", defaults)
        os.environ.update(defaults)
    return threads.start_prioritized(lambda: C.init(comm=comm, process_sets=process_sets), nice)


def restart_horovod() -> None:
    """Shuts Horovod down and starts it again (an elastic reset), its threads' priority set as at init."""
    threads.start_prioritized(C.reinit, threads.horovod_nice(os.environ, _spans_hosts(os.environ)))


def start(comm: Any = None, process_sets: Any = None) -> None:
    """Forms the job and starts Horovod (see `hvdkeras.init`, which also pins the GPU and installs what
    training needs).

    Raises:
        ValueError: the launcher's variables, or HVDKERAS_HOROVOD_NICE, are malformed or inconsistent.
        RuntimeError: the job cannot be formed, or Horovod was already initialized with another size.
    """
    launch = launchers.detect(os.environ)
    if not C.is_initialized():
        # An MPI build of Horovod forms an mpirun job by itself; everything else goes through our rendezvous.
        if launch is not None and not (launch.mpi and C.build_info()["mpi"]):
            formed = rendezvous.form(launch)
            with rendezvous.init_watchdog(formed):
                _start_horovod(comm, process_sets, formed)
        else:
            _start_horovod(comm, process_sets)
    if launch is not None and C.size() != launch.size:
        raise rendezvous.RendezvousSizeError(
            f"{launch.launcher} started {launch.size} processes ({', '.join(launch.variables)}), but Horovod "
            f"formed a job of size {C.size()}: this process would train alone. Horovod was initialized before "
            "hvdkeras.init() (by horovod.tensorflow.init() or another library): call hvdkeras.init() first, or "
            "launch with horovodrun / `hvdkeras run`. To run every process alone on purpose, set "
            "HVDKERAS_LAUNCHER=none."
        )
    # Every rank sets the same; rank 0 alone says what it could not set.
    threads.check_inter_op_threads(C.size(), say=None if C.rank() == 0 else (lambda message: None))


def stop() -> None:
    """Shuts Horovod down, and rank 0's rendezvous where hvdkeras formed the job."""
    C.shutdown()
    rendezvous.stop()
