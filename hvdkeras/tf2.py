"""The rest of `horovod.tensorflow`'s names that TensorFlow 2 loops use, with Horovod's meanings.

`import horovod.tensorflow as hvd` becomes `import hvdkeras as hvd`: the collectives, the rank/size family and
process sets live in hvdkeras.collectives and hvdkeras.basics; this module holds the rest (the graph ops that
read the rank and size, join, grouped allgather and reduce-scatter, alltoall, the GPU check) and the Keras 2
spelling `optimizer.variables()` that Horovod's TF2 examples use. docs/migrating.md lists every public name of
horovod.tensorflow and its status here.
"""

from __future__ import annotations

from typing import Any, Sequence

import keras
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import compression as _compression
from hvdkeras import patches
from hvdkeras.collectives import op_from
from hvdkeras.variables import VariableList, to_tensor

# Horovod's reduction ops beyond Average and Sum: Min, Max and Product reduce tensors in allreduce (not
# gradients); Adasum needs an MPI build, and hvdkeras refuses it with the alternative.
Min, Max, Product, Adasum = C.Min, C.Max, C.Product, C.Adasum


def rank_op(name: str | None = None) -> tf.Tensor:
    """This worker's rank, as a tensor read when the graph runs (Horovod's `rank_op`)."""
    return C.op("rank_op", name=name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This worker's rank on its host, as a tensor read when the graph runs."""
    return C.op("local_rank_op", name=name)


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of workers (of the process set), as a tensor read when the graph runs."""
    return C.op("size_op", process_set_id=process_set_id, name=name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of workers on this host, as a tensor read when the graph runs."""
    return C.op("local_size_op", name=name)


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 where this worker is in the process set, else 0, as a tensor read when the graph runs."""
    return C.op("process_set_included_op", process_set_id=process_set_id, name=name)


def is_homogeneous() -> bool:
    """Whether every host runs the same number of workers."""
    return C.is_homogeneous()


def join(device: str = "") -> tf.Tensor:
    """Horovod's join: this worker has no more data; until every worker has joined, the collectives of the
    others proceed with this worker contributing zeros. Returns the rank of the last worker to join."""
    return C.join(device)


def gpu_available(ext_base_name: str = "tensorflow", verbose: bool = False) -> bool:
    """Whether this Horovod build has GPU support (CUDA or ROCm) and TensorFlow sees a GPU.

    `ext_base_name` is Horovod's: only "tensorflow" has a meaning here.

    Raises:
        ValueError: another framework is named.
    """
    if ext_base_name != "tensorflow":
        raise ValueError(f"hvdkeras knows TensorFlow only. Received: ext_base_name={ext_base_name!r}")
    info = C.build_info()
    available = (info["cuda"] or info["rocm"]) and bool(tf.config.list_physical_devices("GPU"))
    if verbose:
        print(f"hvdkeras: GPU support built: {info['cuda'] or info['rocm']}; GPUs visible to TensorFlow: "
              f"{len(tf.config.list_physical_devices('GPU'))}")
    return bool(available)


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, device_dense: str = "",
                      device_sparse: str = "", compression: Any = _compression.Compression.none,
                      op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Any = C.global_process_set, ignore_name_scope: bool = False,
                      name: str | None = None) -> list[tf.Tensor]:
    """One fused allreduce of a list of tensors (Horovod's `grouped_allreduce`, same parameters).

    Tensors of several dtypes are reduced in one fused call per dtype; `compression` applies to each.
    """
    op = op_from(average, op)
    compressor = _compression.get(compression)
    values = [to_tensor(t) for t in tensors]
    out: list = [None] * len(values)
    by_dtype: dict = {}
    for i, t in enumerate(values):
        by_dtype.setdefault(t.dtype, []).append(i)
    for dtype in sorted(by_dtype, key=lambda d: d.name):
        indices = by_dtype[dtype]
        sent = [compressor.compress(values[i]) for i in indices]
        part = f"{name}.{dtype.name}" if name else None
        with tf.device(device_dense):
            reduced = C.grouped_allreduce([t for t, _ in sent], op=op, prescale_factor=prescale_factor,
                                          postscale_factor=postscale_factor, name=part, process_set=process_set)
        for i, t, (_, ctx) in zip(indices, reduced, sent):
            out[i] = compressor.decompress(t, ctx)
    return out


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: Any = C.global_process_set) -> list[tf.Tensor]:
    """Allgathers each tensor of a list, in one fused call (Horovod's `grouped_allgather`)."""
    return C.grouped_allgather([to_tensor(t) for t in tensors], name=name, process_set=process_set)


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: Any = _compression.Compression.none, op: int = C.Average,
                          process_set: Any = C.global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[tf.Tensor]:
    """Reduce-scatters each tensor of a list in one fused call (Horovod's `grouped_reducescatter`): each worker
    gets its rows of each reduced tensor."""
    compressor = _compression.get(compression)
    sent = [compressor.compress(to_tensor(t)) for t in tensors]
    with tf.device(device_dense):
        out = C.grouped_reducescatter([t for t, _ in sent], op=C.check_op(op), process_set=process_set,
                                      prescale_factor=prescale_factor, postscale_factor=postscale_factor)
    return [compressor.decompress(t, ctx) for t, (_, ctx) in zip(out, sent)]


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set: Any = C.global_process_set) -> Any:
    """Horovod's `alltoall`: sends `splits[i]` rows of `tensor` (equal parts when None) to worker i.

    Returns:
        The rows received from every worker, in rank order; with `splits`, also how many rows came from each.
    """
    return C.alltoall(to_tensor(tensor), splits=splits, name=name, process_set=process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: Any = C.global_process_set):
    """Horovod's `broadcast_object_fn`: a function `fn(obj)` that returns root_rank's `obj` on every worker."""
    def broadcast(obj: Any) -> Any:
        return C.broadcast_object(obj, root_rank=root_rank, name=name)

    return broadcast


# ------------------------------------------------------------------------- Keras 2's optimizer.variables()
def install_variables_call() -> None:
    """Lets `optimizer.variables()` work on Keras 3 optimizers, where `variables` is a list, not a method.

    Horovod's TF2 loop broadcasts `opt.variables()` on its first step; on Keras 3 that call fails with "'list'
    object is not callable" before any Horovod code runs. Installed by `init()` ("optimizer_variables_call" in
    hvdkeras.patches): Keras's base optimizer and LossScaleOptimizer return their lists as a `VariableList`,
    which is the same list and may also be called (DistributedOptimizer returns one itself).
    """
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    def callable_list(owner):
        keras_variables = vars(owner)["variables"]
        return owner, "variables", property(lambda optimizer: VariableList(keras_variables.fget(optimizer)),
                                            doc=keras_variables.__doc__)

    if not patches.installed("optimizer_variables_call"):
        patches.install("optimizer_variables_call",
                        [callable_list(BaseOptimizer), callable_list(keras.optimizers.LossScaleOptimizer)])

