"""The seam over Horovod: the only module of hvdkeras that imports horovod.

Everything else calls these functions, so unit tests can replace them with fakes and the rest of the
package never depends on Horovod's Keras 2 integration (which breaks on Keras 3 variables).
"""

from __future__ import annotations

from typing import Any, Sequence

import horovod.tensorflow as _hvd
import tensorflow as tf

Average = _hvd.Average
Sum = _hvd.Sum
Min = _hvd.Min
Max = _hvd.Max
Product = _hvd.Product
Adasum = _hvd.Adasum
REDUCE_OPS = {Average: "Average", Sum: "Sum"}
OP_NAMES = {**REDUCE_OPS, Min: "Min", Max: "Max", Product: "Product", Adasum: "Adasum"}


def check_op(op: Any, allowed: Any = tuple(REDUCE_OPS)) -> int:
    """Validates a reduction op: hvdkeras.Average or hvdkeras.Sum (for gradients), or one of `allowed`.

    Raises:
        ValueError: any other value; Adasum, which needs an MPI build of Horovod, says what to use instead.
    """
    if isinstance(op, bool) or op not in allowed:
        names = " or ".join(f"hvdkeras.{OP_NAMES[o]}" for o in allowed)
        hint = (" hvdkeras runs Horovod over Gloo, and Adasum needs Horovod's MPI build and its own optimizer "
                "scaling: use op=hvdkeras.Average.") if op == Adasum and not isinstance(op, bool) else ""
        shown = OP_NAMES.get(op, repr(op)) if not isinstance(op, bool) else repr(op)
        raise ValueError(f"`op` must be {names}.{hint} Received: op={shown}")
    return op


# Horovod's own process sets: a ProcessSet([ranks]) registered at init (or later with
# HOROVOD_DYNAMIC_PROCESS_SETS=1) scopes every collective below to those ranks.
ProcessSet = _hvd.ProcessSet
global_process_set = _hvd.global_process_set

def _require_init() -> None:
    if not _hvd.is_initialized():
        raise RuntimeError(
            "hvdkeras has not been initialized. Call `hvdkeras.init()` at the start of every worker "
            "(launched with `hvdkeras run`, `horovodrun`, mpirun or srun) before using it."
        )


def init(comm: Any = None, process_sets: Any = None) -> None:
    _hvd.init(comm=comm, process_sets=process_sets)


def add_process_set(process_set: Any) -> Any:
    _require_init()
    return _hvd.add_process_set(process_set)


def remove_process_set(process_set: Any) -> bool:
    _require_init()
    return _hvd.remove_process_set(process_set)


def shutdown() -> None:
    _hvd.shutdown()


def is_initialized() -> bool:
    return bool(_hvd.is_initialized())


def rank() -> int:
    _require_init()
    return _hvd.rank()


def size() -> int:
    _require_init()
    return _hvd.size()


def local_rank() -> int:
    _require_init()
    return _hvd.local_rank()


def local_size() -> int:
    _require_init()
    return _hvd.local_size()


def cross_rank() -> int:
    _require_init()
    return _hvd.cross_rank()


def cross_size() -> int:
    _require_init()
    return _hvd.cross_size()


def size_tensor(process_set: Any = global_process_set) -> tf.Tensor:
    """The world (or process set) size as a tensor read when the graph runs (it changes in elastic jobs)."""
    _require_init()
    return _hvd.size_op(process_set_id=process_set.process_set_id)


def grouped_allreduce(
    tensors: Sequence[tf.Tensor],
    op: int = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    process_set: Any = global_process_set,
) -> list[tf.Tensor]:
    """One fused allreduce of same-dtype tensors.

    Horovod matches collectives across processes by name. Without one it derives it from the tensor names
    and the name scope, which differ between processes that created different numbers of Keras objects,
    and the job hangs; hvdkeras always passes a name that depends only on the call site.
    """
    _require_init()
    return list(
        _hvd.grouped_allreduce(
            list(tensors),
            op=op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            name=name,
            ignore_name_scope=name is not None,
            process_set=process_set,
        )
    )


def allreduce(
    tensor: tf.Tensor,
    op: int = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    process_set: Any = global_process_set,
) -> tf.Tensor:
    _require_init()
    return _hvd.allreduce(
        tensor,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        name=name,
        ignore_name_scope=name is not None,
        process_set=process_set,
    )


def reducescatter(tensor: tf.Tensor, op: int = Average, name: str | None = None,
                  process_set: Any = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduces `tensor` across workers and returns this worker's rows of the result: the first dimension is
    cut into `size` parts, the first `dim0 % size` workers getting one row more."""
    _require_init()
    return _hvd.reducescatter(tensor, op=op, name=name, ignore_name_scope=name is not None, process_set=process_set,
                              prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def grouped_reducescatter(tensors: Sequence[tf.Tensor], op: int = Average, name: str | None = None,
                          process_set: Any = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[tf.Tensor]:
    """One fused reduce-scatter of same-dtype tensors, named (Horovod's public grouped_reducescatter takes no
    name, and collectives are matched across processes by name)."""
    _require_init()
    from horovod.tensorflow import mpi_ops

    return list(mpi_ops._grouped_reducescatter(list(tensors), name=name, op=op, ignore_name_scope=name is not None,
                                               process_set=process_set, prescale_factor=prescale_factor,
                                               postscale_factor=postscale_factor))


def alltoall(tensor: tf.Tensor, name: str | None = None, process_set: Any = global_process_set,
             splits: Any = None) -> Any:
    """Sends the i-th of `size` equal parts of `tensor`'s first dimension to worker i (or `splits[i]` rows);
    returns the parts received from every worker, in rank order, and with `splits` also how many rows came
    from each."""
    _require_init()
    return _hvd.alltoall(tensor, splits=splits, name=name, ignore_name_scope=name is not None,
                         process_set=process_set)


def grouped_allgather(tensors: Sequence[tf.Tensor], name: str | None = None,
                      process_set: Any = global_process_set) -> list[tf.Tensor]:
    _require_init()
    return list(_hvd.grouped_allgather(list(tensors), name=name, ignore_name_scope=name is not None,
                                       process_set=process_set))


def op(which: str, **kwargs: Any) -> tf.Tensor:
    """Horovod's graph op `which` (rank_op, size_op, local_rank_op, local_size_op, process_set_included_op)."""
    _require_init()
    return getattr(_hvd, which)(**kwargs)


def join(device: str = "") -> tf.Tensor:
    _require_init()
    with tf.device(device):
        return _hvd.join()


def is_homogeneous() -> bool:
    _require_init()
    return bool(_hvd.is_homogeneous())


def allgather(tensor: tf.Tensor, name: str | None = None, process_set: Any = global_process_set) -> tf.Tensor:
    _require_init()
    return _hvd.allgather(tensor, name=name, ignore_name_scope=name is not None, process_set=process_set)


def broadcast(tensor: tf.Tensor, root_rank: int, name: str | None = None,
              process_set: Any = global_process_set) -> tf.Tensor:
    _require_init()
    return _hvd.broadcast(tensor, root_rank, name=name, ignore_name_scope=name is not None, process_set=process_set)


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int,
                        process_set: Any = global_process_set, name: str = "hvdkeras.broadcast_variables") -> None:
    """Broadcasts tf.Variables in place: one broadcast per dtype of all variables packed together.

    Packing avoids one collective per variable, and the explicit names do not depend on how each process
    named its variables (a process that created extra models has other names); inside a tf.function they add
    the packed tensor's name in the traced function, so two broadcasts in one step never share a name.
    Works eagerly and inside tf.function.
    """
    _require_init()
    by_dtype: dict = {}
    for var in variables:
        by_dtype.setdefault(var.dtype, []).append(var)
    for dtype in sorted(by_dtype, key=lambda d: d.name):
        group = by_dtype[dtype]
        flat = tf.concat([tf.reshape(v, [-1]) for v in group], axis=0)
        full = f"{name}.{dtype.name}"
        if not tf.executing_eagerly():
            # Two broadcasts in one tf.function (a model's variables, then the optimizer's) may run at once: each
            # is named by its place in the traced function, the same on every worker.
            full += "." + flat.op.name.replace("/", ".")
        flat = _hvd.broadcast(flat, root_rank, name=full, ignore_name_scope=True, process_set=process_set)
        offset = 0
        for var in group:
            n = int(var.shape.num_elements())
            var.assign(tf.reshape(flat[offset:offset + n], var.shape))
            offset += n


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    _require_init()
    return _hvd.broadcast_object(obj, root_rank=root_rank, name=name)


def allgather_object(obj: Any, name: str | None = None) -> list:
    _require_init()
    return _hvd.allgather_object(obj, name=name)


def barrier() -> None:
    """Returns once every worker has called it."""
    _require_init()
    _hvd.allreduce(tf.constant(0, dtype=tf.int32), op=Sum, name="hvdkeras.barrier", ignore_name_scope=True)


# ------------------------------------------------------------------------------------------- elastic
def elastic_types():
    """Horovod's elastic building blocks: (ObjectState, HorovodInternalError, HostsUpdatedInterrupt)."""
    from horovod.common.elastic import ObjectState
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    return ObjectState, HorovodInternalError, HostsUpdatedInterrupt


def elastic_run(func, reset):
    """Horovod's elastic driver loop around `func(state, ...)`: sync, run, and on a failure or a host change
    restore, `reset()`, re-sync and run again."""
    from horovod.common.elastic import run_fn

    return run_fn(func, reset)


def reinit() -> None:
    """Shuts Horovod down and initializes it again (the new world after an elastic reset)."""
    _hvd.shutdown()
    _hvd.init()


def build_info() -> dict[str, bool]:
    """What this Horovod build has: controllers (gloo, mpi), tensor operations and GPU support."""
    return {name: bool(getattr(_hvd, f"{name}_built")()) for name in ("gloo", "mpi", "nccl", "ddl", "ccl", "cuda",
                                                                         "rocm")}


def enabled_info() -> dict[str, bool]:
    """Which controller this job runs on, and whether MPI was initialized with thread support."""
    _require_init()
    return {"gloo": bool(_hvd.gloo_enabled()), "mpi": bool(_hvd.mpi_enabled()),
            "mpi_threads": bool(_hvd.mpi_threads_supported()) if _hvd.mpi_enabled() else False}


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    _require_init()
    _hvd.start_timeline(file_path, mark_cycles=mark_cycles)


def stop_timeline() -> None:
    _require_init()
    _hvd.stop_timeline()


def version() -> str:
    import horovod

    return horovod.__version__


# -------------------------------------------------------------------------------------------- rendezvous
def rendezvous_parts():
    """Horovod's own rendezvous pieces: (RendezvousHTTPServer, RendezvousHandler, host_plan).

    `host_plan([(host, slots), ...], size)` is Horovod's rank assignment, which sets the size of each of
    the rendezvous scopes (global, local_<host>, cross_<local rank>) so the server can clear them.
    """
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    def host_plan(hosts, size):
        return get_host_assignments([HostInfo(host, slots) for host, slots in hosts], size)

    return RendezvousHTTPServer, RendezvousHandler, host_plan
