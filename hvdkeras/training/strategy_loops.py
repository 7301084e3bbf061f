"""`strategy.run` loops under `hvdkeras run` / `python -m hvdkeras`: the workers are more replicas of the
script's strategy.

TensorFlow's custom-training tutorial distributes a dataset with the script's strategy
(`strategy.experimental_distribute_dataset(dataset)` or `strategy.distribute_datasets_from_function(fn)`),
runs each step with `strategy.run`, scales each replica's loss by the *global* batch
(`tf.nn.compute_average_loss`, a Keras loss, `tf.nn.scale_regularization_loss`), so that the replicas'
gradients are *summed*, and adds up the replicas' losses with `strategy.reduce(SUM, ...)`. Part of the patch
"loops" (`loops.install`), this makes the processes of the job more replicas of that strategy, as
MultiWorkerMirroredStrategy would, while `strategy.num_replicas_in_sync` stays this process's count (so a
script's `GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync` keeps one process's
value, and the job trains on one process's global batches):

- under `--batch global` (the default), `experimental_distribute_dataset` gives each worker its rows of every
  global batch (`data.split_batches`), and `distribute_datasets_from_function` calls the script's function
  with an `InputContext` that counts every worker's input pipelines and replicas (so `input_context.
  get_per_replica_batch_size(GLOBAL_BATCH_SIZE)` and `dataset.shard(input_context.num_input_pipelines,
  input_context.input_pipeline_id)` split the data across the workers);
- inside the script's `strategy.run` on such data, the Keras optimizer's gradients are summed across the
  workers (loops.py's reduction with op Sum), `tf.nn.compute_average_loss` without a `global_batch_size`
  divides by the rows of every worker, a Keras loss's and `tf.nn.scale_regularization_loss`'s division by the
  replicas counts every worker's replicas, and `strategy.reduce(...)` called by the script reduces across
  the workers too (SUM: summed; MEAN: the mean over every replica, or over every row with `axis`);
- under `--batch per-worker` each worker takes whole batches (`data.shard`), or its input pipelines, its
  replicas stay its own, and the gradients are averaged: each worker's batch is the script's batch.

Data hvdkeras cannot split (a dataset the script shards itself, NumPy) is left whole, as loops.py does: each
worker computes every batch, the gradients are averaged, and rank 0 warns once. A step on split data whose
loss goes through none of the global-batch scalings above (a `tf.reduce_mean` over the replica's rows,
which gives every replica's gradient a weight of one in the sum, as on several GPUs) is said once by rank 0.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from typing import Any, Callable

import keras.src.losses.loss as keras_loss
import tensorflow as tf
import tensorflow.python.autograph.impl.api as autograph_api
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.util import tf_decorator

from hvdkeras import _collectives as C
from hvdkeras.training import data, rank_zero, script_writes

# Frames between the script and a strategy method: autograph's calls from a converted tf.function, and
# TensorFlow's decorators (a deprecated name's wrapper).
_PASSED_THROUGH = tuple(os.path.dirname(os.path.dirname(os.path.realpath(m.__file__))) + os.sep
                        for m in (autograph_api, tf_decorator))
# loop: loops.py's state (the --batch convention, "split", and whether a loop's data was split, "split_any");
# depth: how deep the script's strategy.run calls on split data are nested now (0: outside them);
# scaled / applied: whether the outermost of them scaled a loss by the global batch / applied gradients.
_state: dict[str, Any] = {"loop": {}, "depth": 0, "scaled": False, "applied": False, "warned": set()}

LOCAL_MEAN = (
    "hvdkeras: the script's strategy.run step applies gradients on split data, and its loss went through none of "
    "tf.distribute's scalings by the global batch (tf.nn.compute_average_loss, a Keras loss, "
    "tf.nn.scale_regularization_loss). The workers are more replicas of the strategy, and their gradients are "
    "summed, as tf.distribute sums its replicas' gradients: a loss divided by the global batch itself trains as "
    "one process, but a loss averaged over the replica's own rows (tf.reduce_mean) gets the sum of the workers' "
    "mean gradients, N times one process's. Scale the loss with tf.nn.compute_average_loss(per_example_loss) "
    "to train as one process.")
NOT_SHARDED = (
    "hvdkeras: the dataset function given to strategy.distribute_datasets_from_function does not shard its data "
    "(dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)), so every worker reads "
    "the same rows, in batches of input_context.get_per_replica_batch_size(...), which counts every worker's "
    "replicas. Shard by the input context to give each worker its part of the data.")


def changes(loop_state: dict, split: Callable[[Any], Any]) -> list[tuple[Any, str, Any]]:
    """The patch's changes for strategy loops (installed with loops.py's, under its name).

    Args:
        loop_state: loops.py's state, read for "split" (the --batch convention) and "split_any".
        split: loops.py's split of a script's dataset: the dataset split for this worker, or None where it
            is not split.
    """
    _state.update(loop=loop_state, depth=0, scaled=False, applied=False)
    wrappers = {"experimental_distribute_dataset": _distribute_dataset(split),
                "distribute_datasets_from_function": _distribute_from_function,
                "experimental_distribute_datasets_from_function": _distribute_from_function,
                "run": _run, "reduce": _reduce}
    found = [(cls, name, wrap(vars(cls)[name])) for cls in _strategy_classes()
             for name, wrap in wrappers.items() if name in vars(cls)]
    return found + [
        (tf.nn, "compute_average_loss", _compute_average_loss(tf.nn.compute_average_loss)),
        (tf.nn, "scale_regularization_loss", _scale_regularization_loss(tf.nn.scale_regularization_loss)),
        (keras_loss, "scale_loss_for_distribution", _keras_scale(keras_loss.scale_loss_for_distribution, True)),
        (keras_loss, "unscale_loss_for_distribution", _keras_scale(keras_loss.unscale_loss_for_distribution, False)),
    ]


def summing() -> bool:
    """Whether an update now is in the script's strategy.run on split data: the workers' gradients are summed
    (tf.distribute's convention), and the update is noted for the scaling check."""
    if _state["depth"] > 0:
        _state["applied"] = True
        return True
    return False


def _strategy_classes() -> list[type]:
    found, todo = [], [distribute_lib.StrategyBase]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return found


def _multi() -> bool:
    return C.is_initialized() and C.size() > 1


def _from_script(frame: Any) -> bool:
    while frame is not None and os.path.realpath(frame.f_code.co_filename).startswith(_PASSED_THROUGH):
        frame = frame.f_back
    return script_writes.from_script(frame)


def _extends() -> bool:
    """Whether the workers are more replicas of the script's strategy: its data was split by the global batch."""
    loop = _state["loop"]
    return (_multi() and loop.get("split") == "global" and bool(loop.get("split_any"))
            and not loop.get("explicit"))


def _distribute_dataset(split: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def wrap(original):
        @functools.wraps(original)
        def experimental_distribute_dataset(strategy, dataset, options=None):
            mine = None
            if isinstance(dataset, tf.data.Dataset) and _from_script(sys._getframe(1)):
                mine = split(dataset)
            return _handled(original(strategy, dataset if mine is None else mine, options))

        return experimental_distribute_dataset

    return wrap


def _handled(distributed: Any) -> Any:
    """What a strategy gives back: a plain dataset (the default strategy's) is not split again when the script
    iterates it (loops.py)."""
    if isinstance(distributed, tf.data.Dataset):
        _state["loop"]["handled"].add(distributed)
    return distributed


def _distribute_from_function(original):
    @functools.wraps(original)
    def distribute_datasets_from_function(strategy, dataset_fn, options=None):
        how = _state["loop"].get("split")
        if how is None or not _multi() or not _from_script(sys._getframe(1)):
            return original(strategy, dataset_fn, options)
        size, rank = C.size(), C.rank()

        def this_workers(context):
            pipelines = context.num_input_pipelines
            dataset = dataset_fn(tf.distribute.InputContext(
                num_input_pipelines=pipelines * size, input_pipeline_id=rank * pipelines + context.input_pipeline_id,
                num_replicas_in_sync=context.num_replicas_in_sync * (size if how == "global" else 1)))
            if (isinstance(dataset, tf.data.Dataset) and not data.shards_itself(dataset)
                    and "not-sharded" not in _state["warned"]):
                _state["warned"].add("not-sharded")
                if rank_zero.is_rank_zero():
                    warnings.warn(NOT_SHARDED, stacklevel=2)
            return dataset

        _state["loop"]["split_any"] = True
        return _handled(original(strategy, this_workers, options))

    return distribute_datasets_from_function


def _run(original):
    @functools.wraps(original)
    def run(strategy, fn, *args, **kwargs):
        if not _extends() or not _from_script(sys._getframe(1)):
            return original(strategy, fn, *args, **kwargs)
        outermost = _state["depth"] == 0
        if outermost:
            _state.update(scaled=False, applied=False)
        _state["depth"] += 1
        try:
            return original(strategy, fn, *args, **kwargs)
        finally:
            _state["depth"] -= 1
            if (outermost and _state["applied"] and not _state["scaled"]
                    and "local-mean" not in _state["warned"]):
                _state["warned"].add("local-mean")
                if rank_zero.is_rank_zero():
                    warnings.warn(LOCAL_MEAN, stacklevel=2)

    return run


def _name(base: str) -> str | None:
    """A collective's name: fixed eagerly (one at a time); in a tf.function, Horovod's own, from the graph."""
    return base if tf.executing_eagerly() else None


def _reduce(original):
    @functools.wraps(original)
    def reduce(strategy, reduce_op, value, *args, **kwargs):
        local = original(strategy, reduce_op, value, *args, **kwargs)
        if not _extends() or not _from_script(sys._getframe(1)):
            return local
        axis = args[0] if args else kwargs.get("axis")
        op = reduce_op if isinstance(reduce_op, tf.distribute.ReduceOp) else tf.distribute.ReduceOp(
            str(reduce_op).upper())
        if op == tf.distribute.ReduceOp.SUM:
            return C.allreduce(local, op=C.Sum, name=_name("hvdkeras.strategy.reduce"))
        if axis is None:
            return C.allreduce(local, op=C.Average, name=_name("hvdkeras.strategy.reduce"))
        # The mean over every row of every worker: each worker's mean weighted by its rows.
        rows = tf.add_n([tf.cast(tf.shape(v)[axis], local.dtype) for v in strategy.experimental_local_results(value)])
        total = C.allreduce(tf.stack([local * rows, rows]) if local.shape.rank == 0 else local * rows,
                            op=C.Sum, name=_name("hvdkeras.strategy.reduce"))
        if local.shape.rank == 0:
            return total[0] / total[1]
        return total / C.allreduce(rows, op=C.Sum, name=_name("hvdkeras.strategy.rows"))

    return reduce


def _compute_average_loss(original):
    @functools.wraps(original)
    def compute_average_loss(per_example_loss, sample_weight=None, global_batch_size=None):
        if _state["depth"] > 0:
            _state["scaled"] = True
            per_example_loss = tf.convert_to_tensor(per_example_loss)
            if global_batch_size is None and per_example_loss.shape.rank != 0:
                rows = C.allreduce(tf.shape(per_example_loss)[0], op=C.Sum, name=_name("hvdkeras.strategy.rows"))
                global_batch_size = rows * tf.distribute.get_strategy().num_replicas_in_sync
        return original(per_example_loss, sample_weight=sample_weight, global_batch_size=global_batch_size)

    return compute_average_loss


def _scale_regularization_loss(original):
    @functools.wraps(original)
    def scale_regularization_loss(regularization_loss):
        scaled = original(regularization_loss)
        if _state["depth"] == 0:
            return scaled
        _state["scaled"] = True
        return scaled / tf.cast(C.size(), scaled.dtype)

    return scale_regularization_loss


def _keras_scale(original, down: bool):
    @functools.wraps(original)
    def scale(value):
        value = original(value)
        if _state["depth"] == 0:
            return value
        _state["scaled"] = True
        factor = 1.0 / C.size() if down else float(C.size())
        return value * tf.cast(factor, value.dtype)

    return scale
