"""Process-level basics: init, topology, and the collectives users call directly."""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any, Iterable, Sequence

import numpy as np
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import _threads, launching, patches, rendezvous, settings, sync_batch_norm
from hvdkeras import compression as _compression
from hvdkeras.variables import tf_variable, to_tensor

log = logging.getLogger("hvdkeras")

Average = C.Average
Sum = C.Sum


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
    nice = _threads.horovod_nice(os.environ, spans, gloo=True if formed is not None else None)
    defaults = horovod_defaults(os.environ, spans)
    if defaults:
        log.info("hvdkeras: the job spans hosts: %s", defaults)
        os.environ.update(defaults)
    return _threads.start_prioritized(lambda: C.init(comm=comm, process_sets=process_sets), nice)


def restart_horovod() -> None:
    """Shuts Horovod down and starts it again (an elastic reset), its threads' priority set as at init."""
    _threads.start_prioritized(C.reinit, _threads.horovod_nice(os.environ, _spans_hosts(os.environ)))


def init(comm: Any = None, process_sets: Any = None, pin_gpus: bool = True) -> None:
    """Initializes Horovod for this worker and pins it to one GPU by local rank.

    Where horovodrun did not set Horovod up, the job is formed from the launcher's environment (Slurm's
    srun, OpenMPI's mpirun, MPICH / Intel MPI, torchrun / Kubernetes RANK and WORLD_SIZE; see
    `hvdkeras.launching`): rank 0 hosts Horovod's rendezvous and the others find it. A launcher that
    started N > 1 processes never yields N jobs of size 1: `init` raises instead. When the job spans hosts,
    Horovod's cycle time is 5 ms (unless set), and over Gloo the threads Horovod starts run at nice -15 where
    the process may (`HVDKERAS_HOROVOD_NICE` sets another value, or `none`; see docs/network.md).

    Args:
        comm: an mpi4py communicator or list of ranks, for an MPI build of Horovod (as in Horovod).
        process_sets: `hvdkeras.ProcessSet`s to register, or "dynamic" (as in Horovod).
        pin_gpus: make only the GPU of `local_rank()` visible to TensorFlow (when GPUs exist and the process
            has not chosen its own; see `pin_gpu`).

    Raises:
        ValueError: the launcher's variables, or HVDKERAS_HOROVOD_NICE, are malformed or inconsistent (named in
            the message); more processes on a host than GPUs.
        RuntimeError: the job cannot be formed (unreachable rendezvous, missing ranks, another job on the
            port, ranks disagreeing on the size, or Horovod already initialized with another size).

    Example:
        >>> import hvdkeras as hvd
        >>> hvd.init()
        >>> hvd.rank(), hvd.size()
    """
    launch = launching.detect(os.environ)
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
    sync_batch_norm.install()
    if pin_gpus:
        pin_gpu(C.local_rank(), C.local_size())


def shutdown() -> None:
    """Shuts Horovod down (and rank 0's rendezvous, where hvdkeras formed the job), and undoes the Keras
    patch that `init()` installed."""
    C.shutdown()
    rendezvous.stop()
    patches.uninstall("sync_batch_norm")


# Horovod's own functions and objects, unchanged.
ProcessSet = C.ProcessSet
global_process_set = C.global_process_set
add_process_set = C.add_process_set
remove_process_set = C.remove_process_set
start_timeline = C.start_timeline
stop_timeline = C.stop_timeline
is_initialized = C.is_initialized
rank = C.rank
size = C.size
local_rank = C.local_rank
local_size = C.local_size
cross_rank = C.cross_rank
cross_size = C.cross_size


def _op_from(average: Any, op: Any) -> int:
    """Horovod's rule: `average` (deprecated) and `op` exclude each other; neither means Average."""
    if average is not None and op is not None:
        raise ValueError(f"Pass `op` or the deprecated `average`, not both. Received: average={average!r}, op={op!r}")
    if average is not None:
        return C.Average if average else C.Sum
    return C.Average if op is None else C.check_op(op)


def allreduce(
    value: Any,
    name: str | None = None,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: int | None = None,
    compression: Any = _compression.Compression.none,
    process_set: Any = C.global_process_set,
) -> tf.Tensor:
    """Averages (or sums) a tensor across all workers (Horovod's `hvd.allreduce`, same parameters).

    Args:
        value: a tensor, array, number or Keras variable (same shape and dtype on every worker).
        name: optional name of the collective (must match across workers if given).
        average: deprecated, as in Horovod: True is op=Average, False op=Sum.
        prescale_factor: multiply by this before the reduction.
        postscale_factor: multiply by this after the reduction.
        op: `hvdkeras.Average` (the default) or `hvdkeras.Sum`.
        compression: `hvdkeras.Compression.none` or `.fp16`.
        process_set: reduce among the ranks of this `hvdkeras.ProcessSet` only (default: all).

    Returns:
        A tensor with the reduced value, the same on every worker.

    Example:
        >>> hvd.allreduce([0.2, -0.1, 0.5])  # with [0.4, 0.0, 0.3] on the other worker
        <tf.Tensor: [0.3, -0.05, 0.4]>
    """
    op = _op_from(average, op)
    compressor = _compression.get(compression)
    t = to_tensor(value)
    sent, ctx = compressor.compress(t)
    out = C.allreduce(sent, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor, name=name,
                      process_set=process_set)
    return compressor.decompress(out, ctx)


def reducescatter(value: Any, name: str | None = None, op: int = Average,
                  process_set: Any = C.global_process_set) -> tf.Tensor:
    """Reduces a tensor across workers and gives each its slice of the first axis (Horovod's reducescatter)."""
    return C.reducescatter(to_tensor(value), op=C.check_op(op), name=name, process_set=process_set)


def allgather(value: Any, name: str | None = None, process_set: Any = C.global_process_set) -> tf.Tensor:
    """Concatenates every worker's tensor along the first axis (first dimensions may differ)."""
    return C.allgather(to_tensor(value), name=name, process_set=process_set)


def broadcast(value: Any, root_rank: int = 0, name: str | None = None,
              process_set: Any = C.global_process_set) -> tf.Tensor:
    """Returns root_rank's value of `value` on every worker."""
    _check_root_rank(root_rank)
    return C.broadcast(to_tensor(value), root_rank, name=name, process_set=process_set)


def broadcast_global_variables(root_rank: int) -> None:
    """Horovod's TF1 call: TensorFlow 2 has no global variables, and Horovod raises here too.

    Raises:
        RuntimeError: always, naming what to use instead.
    """
    raise RuntimeError(
        "broadcast_global_variables() needs TensorFlow 1's global variable collection, which TensorFlow 2 and "
        "Keras 3 do not have (Horovod raises in eager mode as well). Use "
        "hvdkeras.callbacks.BroadcastGlobalVariablesCallback(root_rank) in fit, or "
        f"hvdkeras.broadcast_variables(model.variables, root_rank={root_rank!r}) in a custom loop."
    )


def _built(name: str):
    def built() -> bool:
        return C.build_info()[name]

    built.__name__ = f"{name}_built"
    built.__doc__ = f"Whether this Horovod build has {name.upper()} support."
    return built


gloo_built, mpi_built, nccl_built, ddl_built, ccl_built, cuda_built, rocm_built = (
    _built(n) for n in ("gloo", "mpi", "nccl", "ddl", "ccl", "cuda", "rocm"))


def gloo_enabled() -> bool:
    """Whether this job runs on Gloo."""
    return C.enabled_info()["gloo"]


def mpi_enabled() -> bool:
    """Whether this job runs on MPI."""
    return C.enabled_info()["mpi"]


def mpi_threads_supported() -> bool:
    """Whether MPI was initialized with multi-threading support (False when the job does not run on MPI)."""
    return C.enabled_info()["mpi_threads"]


def _check_root_rank(root_rank: Any) -> None:
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)):
        raise TypeError(f"`root_rank` must be an integer. Received: root_rank={root_rank!r}")
    if not 0 <= root_rank < C.size():
        raise ValueError(
            f"`root_rank` must be in [0, size()) = [0, {C.size()}). Received: root_rank={root_rank}"
        )


def _describe(variable: Any) -> tuple[str, tuple, str]:
    name = getattr(variable, "path", None) or getattr(variable, "name", "?")
    dtype = variable.dtype
    return str(name), tuple(int(d) if d is not None else -1 for d in variable.shape), getattr(dtype, "name", str(dtype))


def check_same_variables(variables: Sequence[Any]) -> None:
    """Raises on every worker, naming the first variable that differs, when workers hold different models.

    One allgather of a digest of the shapes and dtypes (names may differ legitimately: Keras numbers layers
    per process); only on a mismatch are the full lists exchanged to say where.

    Raises:
        ValueError: the variables differ in number, shape or dtype between workers.
    """
    if not C.is_initialized() or C.size() == 1:
        return
    described = [_describe(v) for v in variables]
    digest = hashlib.sha256(repr([(shape, dtype) for _, shape, dtype in described]).encode()).hexdigest()
    digests = C.allgather_object(digest, name="hvdkeras.check_models.digest")
    if len(set(digests)) == 1:
        return
    everyone = C.allgather_object(described, name="hvdkeras.check_models.variables")
    raise ValueError(_mismatch_message(everyone))


def _mismatch_message(everyone: list[list[tuple[str, tuple, str]]]) -> str:
    def show(entry):
        name, shape, dtype = entry
        return f"{name!r} shape={shape} dtype={dtype}"

    reference = everyone[0]
    for rank, mine in enumerate(everyone[1:], start=1):
        for i in range(max(len(reference), len(mine))):
            a = reference[i] if i < len(reference) else None
            b = mine[i] if i < len(mine) else None
            if a is None or b is None or a[1:] != b[1:]:
                detail = (
                    f"variable #{i}: rank 0 has {show(a) if a else 'nothing'}, "
                    f"rank {rank} has {show(b) if b else 'nothing'}"
                )
                return (
                    "The workers built different models, so their gradients cannot be averaged. First "
                    f"difference at {detail} (rank 0 has {len(reference)} variables, rank {rank} has {len(mine)}). "
                    "Build the same model on every worker. To skip this check, pass check_models=False to "
                    "BroadcastGlobalVariablesCallback or set HVDKERAS_CHECK_MODELS=0."
                )
    return "The workers built different models (their variable digests differ)."


_WORDS = {1: tf.int8, 2: tf.int16, 4: tf.int32, 8: tf.int64}


def checksums(variables: Sequence[Any]) -> list[int]:
    """One integer per variable, computed from its bits: the sum of its words, wrapping as int64.

    Integer sums do not depend on the order of summation, so two workers' checksums of a variable are
    equal whenever its values are bit-identical; a real divergence makes them differ.
    """
    out = []
    for var in variables:
        value = tf.convert_to_tensor(var)
        if value.dtype == tf.bool:
            value = tf.cast(value, tf.int8)
        words = value if value.dtype.is_integer else tf.bitcast(value, _WORDS[value.dtype.size])
        out.append(int(tf.reduce_sum(tf.cast(words, tf.int64)).numpy()))
    return out


def check_in_sync(variables: Sequence[Any], when: str, hint: str = "") -> None:
    """Raises on every worker, naming the first variable, when the workers' values of `variables` differ.

    One allgather of one integer per variable (`checksums`). Data-parallel workers apply the same averaged
    gradients to the same weights, so their trainable weights stay bit-identical; a difference means some
    gradients were applied without being averaged, and the workers no longer train one model.

    Args:
        variables: the variables, in the same order on every worker.
        when: when the check runs, for the message ("after epoch 1").
        hint: what to do, appended to the message.

    Raises:
        RuntimeError: the values differ between workers.
    """
    variables = list(variables)
    if not C.is_initialized() or C.size() == 1 or not variables:
        return
    everyone = C.allgather_object(checksums(variables), name="hvdkeras.check_models.checksums")
    for rank, mine in enumerate(everyone[1:], start=1):
        for i, (a, b) in enumerate(zip(everyone[0], mine)):
            if a != b:
                name = _describe(variables[i])[0]
                raise RuntimeError(
                    f"The workers' weights differ {when}: {name!r} (variable #{i} of {len(variables)}) is not "
                    f"the same on rank 0 and rank {rank}, so the workers no longer train one model. {hint}"
                    "To skip this check, pass check_models=False to BroadcastGlobalVariablesCallback or set "
                    "HVDKERAS_CHECK_MODELS=0.")


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0, check: bool | None = None) -> None:
    """Sets every worker's variables to root_rank's values, in place.

    Works with Keras 3 `keras.Variable`s (which have no `.ref()`) and with `tf.Variable`s. First checks that
    every worker holds the same variables (shapes and dtypes), so different models fail at once with the
    first variable that differs instead of hanging or failing later in a collective.

    Args:
        variables: the variables, in the same order on every worker.
        root_rank: the worker whose values are kept.
        check: compare the workers' variables first; default True unless HVDKERAS_CHECK_MODELS=0.

    Raises:
        ValueError: the workers' variables differ (see `check_same_variables`), or a bad root_rank.

    Example:
        >>> hvd.broadcast_variables(model.variables, root_rank=0)
    """
    _check_root_rank(root_rank)
    variables = list(variables)
    if check is None:
        check = settings.read().check_models
    if check:
        check_same_variables(variables)
    C.broadcast_variables([tf_variable(v) for v in variables], root_rank)


broadcast_object = C.broadcast_object
allgather_object = C.allgather_object
