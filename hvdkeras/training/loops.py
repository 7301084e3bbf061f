"""Unmodified custom training loops under `hvdkeras run` / `python -m hvdkeras`: one model, not one per worker.

A loop that computes gradients with its own `tf.GradientTape` and applies them with a Keras optimizer
(`apply_gradients` or `apply`, eagerly or in a `tf.function`, in a `strategy.run` step too) would train one
model per worker. Installed as the patch "loops" (part of `wrap.install`), this makes every Keras optimizer's
`apply` data-parallel at the outermost optimizer:

- the gradients are all-reduced (averaged) across the workers before the update, through the same
  the allreduce reducer as DistributedOptimizer, so a LossScaleOptimizer's finiteness check, gradient
  clipping and weight decay all see the reduced gradients and every rank skips an overflowing step together;
  an optimizer inside it (a LossScaleOptimizer's, a DistributedOptimizer's) is left alone, and gradients a
  DistributedGradientTape already reduced are not reduced again;
- before an optimizer first updates a variable, the variable and the optimizer's state are broadcast from
  rank 0, so every rank holds the same model from before the first update to the end (eagerly, or once when
  the step is first traced). A DistributedOptimizer is left to the script and to fit's callbacks, as before;
  `model.train_on_batch` broadcasts the model itself (wrap/methods.py);
- the loop's data: a batched `tf.data.Dataset` that the script iterates itself (`for x, y in dataset`, or
  `iter(dataset)`, eagerly) and has not sharded itself is split as fit splits it: under `--batch global` each
  worker takes its rows of every batch (`data.split_batches`), under `--batch per-worker` whole batches
  (`data.shard`); a dataset the script gives its tf.distribute strategy is split by strategy_loops.py, where
  the workers become more replicas of the strategy. Data hvdkeras cannot split (NumPy sliced by hand, a
  dataset iterated inside a tf.function or sharded by the script) is left whole: each worker computes every
  batch, which equals one process, and rank 0 warns once, at the first update, that the loop's data is not
  split and what to change;
- once a loop's data is split, a Keras metric's `result()` read by the script (eagerly) is computed from the
  metric's states summed across the workers (`metric_states.global_result`), so the loop prints the numbers
  one process prints for its Keras metrics; the script's own tensors (a loss it prints) stay each worker's.

Refused with one clear error: an update inside `tf.function(jit_compile=True)`, where Horovod's collectives
cannot be compiled.

Clipping written in the loop: `tf.clip_by_global_norm` and `tf.clip_by_norm` given a tape's gradients of
variables on split data average them across the workers first, then clip, as one process clips the whole
batch's gradient; the optimizer does not reduce the clipped gradients again. Said once: a global-norm clip by a
norm the script computed itself (`use_norm=`), which stays each worker's.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import warnings
import weakref
from typing import Any

import keras
import tensorflow as tf
from keras.src.metrics.metric import Metric
from keras.src.optimizers.base_optimizer import BaseOptimizer
from tensorflow.python.eager.polymorphic_function.polymorphic_function import UnliftedInitializerVariable

from hvdkeras import _collectives as C
from hvdkeras import collectives, patches
from hvdkeras.reduce import AllreduceReducer, PeriodicReducer, Reducer, from_spec
from hvdkeras.reduce.context import in_xla_context, inside_reduction, is_reduced, mark_reduced, reducing
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.training import data, metric_states, rank_zero, script_writes, strategy_loops
from hvdkeras.variables import NamesByIdentity, tf_variable, var_id

log = logging.getLogger("hvdkeras")
PATCH = "loops"
# split: how the script's own iteration of a batched dataset is split (None: not at all); split_any: whether a
# dataset was split in this process, from which on Keras metric results are global.
# handled: the datasets a strategy of the script gave back already split (or left whole), not split again.
# explicit: the script called hvdkeras.init() itself (leave_data). clip_sites: the places in the script that clip
# gradients, numbered in the order first reached (_clip_name).
_state: dict[str, Any] = {"options": None, "names": NamesByIdentity("hvdkeras.loop"), "warned": set(),
                          "split": None, "split_any": False, "handled": weakref.WeakSet(), "explicit": False,
                          "clip_sites": {}}

NOT_SPLIT = (
    "hvdkeras: the script trains in a loop of its own (its optimizer's apply_gradients or apply), and the loop's "
    "data is not split: it is no batched tf.data.Dataset that the script iterates eagerly (NumPy sliced by hand, "
    "a dataset iterated in a tf.function), so each worker computes every "
    "batch and the workers' gradients are averaged; the job trains one model, as one process would, at one "
    "process's speed. To split the data, iterate a batched tf.data.Dataset in Python, pass the data to "
    "model.fit, or shard it in the script (dataset.shard(hvdkeras.size(), hvdkeras.rank())) and run with "
    "--no-shard.")


def install(options: ReductionOptions | None = None, batch: str | None = None, reducer: str = "allreduce") -> bool:
    """Makes every Keras optimizer's `apply` data-parallel in this process (see the module's docstring).

    Args:
        options: how the loops' gradients are reduced (default: DistributedOptimizer's defaults).
        batch: how the script's own iteration of a batched dataset is split: "global" (each worker its rows
            of every batch), "per-worker" (whole batches) or None (not split).
        reducer: `--reducer`'s spec: each optimizer the script applies gets a reducer of its own made from it
            (its state lives as long as the optimizer). The reduce-scatter shards model.fit's optimizer only:
            a loop's optimizer keeps its whole state and reduces by the allreduce.
    """
    if batch not in ("global", "per-worker", None):
        raise ValueError(f"`batch` must be 'global', 'per-worker' or None. Received: batch={batch!r}")
    from_spec(reducer)  # a bad spec fails now
    _state.update(options=options or ReductionOptions(), split=batch, split_any=False, explicit=False,
                  reducer=reducer)
    changes = [(owner, "apply", _data_parallel(vars(owner)["apply"]))
               for owner in (BaseOptimizer, keras.optimizers.LossScaleOptimizer)]
    changes.append((tf.data.Dataset, "__iter__", _split_iteration(vars(tf.data.Dataset)["__iter__"])))
    changes += [(cls, "result", _global_result(vars(cls)["result"])) for cls in _metric_classes()]
    changes.append((Metric, "__init_subclass__", classmethod(_wrap_new_metric)))
    changes.append((tf.GradientTape, "gradient", _registering(vars(tf.GradientTape)["gradient"])))
    changes.append((tf, "clip_by_global_norm", _clip_exact(tf.clip_by_global_norm)))
    changes.append((tf, "clip_by_norm", _clip_norm_exact(tf.clip_by_norm)))
    changes += strategy_loops.changes(_state, split_for_loop)
    return patches.install(PATCH, changes)


def uninstall() -> bool:
    _state["names"].clear()
    _state["clip_sites"].clear()
    return patches.uninstall(PATCH)


def _split_iteration(dataset_iter):
    def __iter__(dataset):  # noqa: N807 - tf.data.Dataset.__iter__, patched
        mine = None
        if tf.executing_eagerly() and script_writes.from_script(sys._getframe(1)):
            mine = split_for_loop(dataset)
        return dataset_iter(dataset if mine is None else mine)

    __iter__.__wrapped__ = dataset_iter
    return __iter__


def leave_data() -> None:
    """The script called `hvdkeras.init()` itself: it uses the explicit API (a DistributedGradientTape, or
    Horovod's TF2 pattern), in which each worker's data is what the script gives it, so its loops' datasets are
    not split (as a model the script compiles with a DistributedOptimizer is left as it made it)."""
    _state["explicit"] = True


def split_for_loop(dataset: tf.data.Dataset) -> tf.data.Dataset | None:
    """This worker's part of a dataset the script's loop iterates (or distributes with its strategy), by the
    --batch convention; None where it stays whole: no convention, one worker, a dataset that yields no batches
    or that the script shards itself, or whole batches of an endless stream under --batch per-worker."""
    how = _state["split"]
    if (how is None or _state["explicit"] or not C.is_initialized() or C.size() == 1 or dataset in _state["handled"]
            or not data.loop_splittable(dataset)):
        return None
    if how == "per-worker" and dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        return None
    _state["split_any"] = True
    return data.split_batches(dataset) if how == "global" else data.shard(dataset)


# Gradients the script's tapes returned for variables, by id, while they live: the tensors that clipping in the
# loop reduces before it clips (a tensor of the model's forward pass is never reduced).
_gradients: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def _registering(tape_gradient):
    def gradient(tape, target, sources, *args, **kwargs):
        grads = tape_gradient(tape, target, sources, *args, **kwargs)
        if C.is_initialized() and C.size() > 1:
            for source, grad in zip(tf.nest.flatten(sources), tf.nest.flatten(grads)):
                if grad is not None and isinstance(source, (keras.Variable, tf.Variable)):
                    _gradients[id(grad)] = grad
        return grads

    gradient.__wrapped__ = tape_gradient
    gradient.__doc__ = tape_gradient.__doc__
    return gradient


def _clipping_gradients(flat: list, caller: Any) -> bool:
    """Whether a clip in the loop gets the gradients of its part of the batch, where one process would clip the
    whole batch's: the data is split, every tensor is a tape's gradient of a variable, and not all of them are
    reduced already (by a DistributedGradientTape)."""
    return (_state["split_any"] and not _state["explicit"] and patches.installed(PATCH) and C.is_initialized()
            and C.size() > 1 and bool(flat) and script_writes.from_script(caller)
            and all(_gradients.get(id(t)) is t for t in flat) and not all(is_reduced(t) for t in flat))


# In each traced step (its graph, while it lives): how many times each place clipped in it.
_clip_counts: "weakref.WeakKeyDictionary[Any, dict[int, int]]" = weakref.WeakKeyDictionary()


def _clip_name(caller: Any) -> str:
    """The collectives' name of a clip's reduction: by its place in the script (numbered in the order first
    reached, the same on every worker: a traced step's source file is named differently on each), and in a
    traced step by its count there too, since two reductions of one graph may run at the same time."""
    sites = _state["clip_sites"]
    index = sites.setdefault((caller.f_code.co_filename, caller.f_lineno), len(sites))
    name = f"hvdkeras.loop_clip.{index}"
    if tf.inside_function():
        counts = _clip_counts.setdefault(tf.compat.v1.get_default_graph(), {})
        counts[index] = counts.get(index, -1) + 1
        name += f".{counts[index]}"
    return name


def _reduce_for_clip(flat: list, caller: Any) -> list:
    return AllreduceReducer(_options()).reduce(flat, flat, name=_clip_name(caller)).grads


CLIPPED_BEFORE = (
    "hvdkeras: the loop clips its gradients by a norm it computed itself (tf.clip_by_global_norm(..., use_norm=...)) "
    "before the optimizer applies them, and its data is split: each worker clips the gradient of its part of the "
    "batch by its own norm, and hvdkeras averages the clipped gradients in the optimizer, where one process clips "
    "the gradient of the whole batch. The job still trains one model. To clip as one process does, leave out "
    "use_norm (hvdkeras then averages the gradients before the clip), give the optimizer global_clipnorm=..., or "
    "reduce first with hvdkeras.DistributedGradientTape.")


def _clip_exact(tf_clip_by_global_norm):
    """tf.clip_by_global_norm on a tape's gradients of split data: the gradients are averaged across the workers
    first (as the optimizer would average them), then clipped, so the clip sees one process's gradient; the
    clipped gradients, the same on every worker, are not reduced again by the optimizer."""
    def clip_by_global_norm(t_list, clip_norm, use_norm=None, name=None):
        caller = sys._getframe(1)
        flat = [t for t in t_list if t is not None] if isinstance(t_list, (list, tuple)) else []
        if not _clipping_gradients(flat, caller) or in_xla_context():
            return tf_clip_by_global_norm(t_list, clip_norm, use_norm=use_norm, name=name)
        if use_norm is not None:
            if "clip" not in _state["warned"]:
                _state["warned"].add("clip")
                if rank_zero.is_rank_zero():
                    warnings.warn(CLIPPED_BEFORE, stacklevel=2)
            return tf_clip_by_global_norm(t_list, clip_norm, use_norm=use_norm, name=name)
        reduced = iter(_reduce_for_clip(flat, caller))
        t_list = [None if t is None else next(reduced) for t in t_list]
        clipped, norm = tf_clip_by_global_norm(t_list, clip_norm, name=name)
        mark_reduced(clipped)
        return clipped, norm

    clip_by_global_norm.__wrapped__ = tf_clip_by_global_norm
    clip_by_global_norm.__doc__ = tf_clip_by_global_norm.__doc__
    return clip_by_global_norm


def _clip_norm_exact(tf_clip_by_norm):
    """tf.clip_by_norm on a tape's gradient of split data: averaged across the workers, then clipped (see
    _clip_exact)."""
    def clip_by_norm(t, clip_norm, axes=None, name=None):
        caller = sys._getframe(1)
        if t is None or not _clipping_gradients([t], caller) or in_xla_context():
            return tf_clip_by_norm(t, clip_norm, axes=axes, name=name)
        clipped = tf_clip_by_norm(_reduce_for_clip([t], caller)[0], clip_norm, axes=axes, name=name)
        mark_reduced([clipped])
        return clipped

    clip_by_norm.__wrapped__ = tf_clip_by_norm
    clip_by_norm.__doc__ = tf_clip_by_norm.__doc__
    return clip_by_norm


def _metric_classes() -> list[type]:
    """Every Keras metric class defined so far that has a `result` of its own."""
    found, todo = [], [Metric]
    while todo:
        cls = todo.pop()
        if "result" in vars(cls) and not getattr(vars(cls)["result"], "_hvdkeras_global", False):
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def _wrap_new_metric(cls, **kwargs):
    """A metric class the script defines after the patch: its `result` is made global too (while the patch
    is installed)."""
    super(Metric, cls).__init_subclass__(**kwargs)
    if "result" in vars(cls):
        cls.result = _global_result(vars(cls)["result"])


def _global_result(metric_result):
    def result(metric, *args, **kwargs):
        if (not _state["split_any"] or not patches.installed(PATCH) or not tf.executing_eagerly()
                or C.size() == 1 or not script_writes.from_script(sys._getframe(1))):
            return metric_result(metric, *args, **kwargs)
        return metric_states.global_result([metric], lambda: metric_result(metric, *args, **kwargs),
                                           name="hvdkeras.loop_metrics")

    result._hvdkeras_global = True
    result.__wrapped__ = metric_result
    result.__doc__ = metric_result.__doc__
    return result


def _data_parallel(keras_apply):
    def apply(optimizer, grads, trainable_variables=None):
        if inside_reduction() or not C.is_initialized() or C.size() == 1:
            return keras_apply(optimizer, grads, trainable_variables)
        grads = list(grads)
        if not grads:
            return keras_apply(optimizer, grads, trainable_variables)
        if in_xla_context():
            raise RuntimeError(
                "The script applies gradients with a Keras optimizer inside tf.function(jit_compile=True), and "
                "hvdkeras must average them across the workers there with Horovod's collectives, which XLA "
                "cannot compile. Compile only the gradient computation (return the gradients from the "
                "jit_compile=True function and call optimizer.apply_gradients outside it), or use "
                "tf.function(jit_compile=False) for the step.")
        with reducing():
            variables = list(trainable_variables) if trainable_variables is not None else None
            if variables is None and optimizer.built:
                variables = list(optimizer._trainable_variables)
            if variables is None:  # Keras's own error: an unbuilt optimizer needs the variables
                return keras_apply(optimizer, grads, trainable_variables)
            _sync_before_first_update(optimizer, variables)
            reducer = _reducer_for(optimizer, variables)
            reduced = reducer.reduce(grads, variables, name=_name_for(optimizer))
            result = keras_apply(optimizer, reduced.grads, trainable_variables)
            reducer.after_apply(reduced)
            return result

    apply.__wrapped__ = keras_apply
    apply.__doc__ = keras_apply.__doc__
    return apply


def _reducer_for(optimizer: Any, variables: list) -> Reducer:
    """The reducer of an optimizer the script applies: the allreduce, or (`--reducer`) one made for it at its first
    update and kept with it. Inside strategy.run, whose replicas' gradients are summed, always the allreduce."""
    spec = _state.get("reducer", "allreduce")
    if spec == "allreduce" or strategy_loops.summing():
        return AllreduceReducer(_options())
    reducer = optimizer.__dict__.get("_hvdkeras_reducer")
    if reducer is None:
        made = from_spec(spec)
        if isinstance(made, str):  # the reduce-scatter: model.fit's optimizer only
            reducer = AllreduceReducer(_options())
        else:
            reducer = made
            reducer.bind(_options())
            if isinstance(reducer, PeriodicReducer):
                log.info("hvdkeras: %r for the script's own loop: only the variables it updates are averaged; "
                         "pass the model's non-trainable state to it (reducer.average_also) to average it too",
                         reducer)
        with tf.init_scope():
            reducer.build(variables)
        optimizer.__dict__["_hvdkeras_reducer"] = reducer
    return reducer


def _options() -> ReductionOptions:
    """The loops' reduction: the workers' gradients averaged, or summed in the script's strategy.run on split
    data (strategy_loops.py), where each replica's loss is already divided by the global batch."""
    options = _state["options"]
    if not strategy_loops.summing():
        return options
    return dataclasses.replace(options, op=C.Sum, gradient_predivide_factor=1.0)


def _name_for(optimizer: Any) -> str:
    """The collectives' names of an optimizer's reductions: by the order in which optimizers first apply, the
    same on every worker, and distinct for two optimizers whose updates may run at the same time (a GAN's)."""
    return _state["names"].name_for(optimizer)


def _sync_before_first_update(optimizer: Any, variables: list) -> None:
    """Broadcasts rank 0's values of the variables this optimizer has not updated before, and its state, once.

    Eagerly, at the first update, or when a tf.function step is first traced (under tf.init_scope). A model
    built in the step's first trace (a Sequential without an Input) has variables whose values exist only
    once that trace is done: those are broadcast inside the traced step, guarded by a flag variable that the
    first run of the step clears.
    """
    synced = optimizer.__dict__.setdefault("_hvdkeras_synced", set())
    new = [v for v in variables if var_id(v) not in synced]
    if not new:
        return
    with tf.init_scope():
        if not optimizer.built:
            optimizer.build(variables)
            optimizer.built = True
    everything = new + list(optimizer.variables)
    key = frozenset(var_id(v) for v in new)
    if tf.inside_function() and any(isinstance(tf_variable(v), UnliftedInitializerVariable) for v in new):
        # Made in this trace, so readable only inside it. tf.function may trace the step again before it first
        # runs (once it made variables): every trace until the first run holds the guarded broadcast, with the
        # same flag; a trace after it holds none.
        pending = optimizer.__dict__.setdefault("_hvdkeras_pending", {})
        with tf.init_scope():
            if key not in pending:
                pending[key] = tf.Variable(True, trainable=False, name="hvdkeras_broadcast_pending")
            elif not bool(pending[key].numpy()):
                synced.update(key)
                return
        flag = pending[key]

        def broadcast():
            collectives.broadcast_variables(everything, root_rank=0, check=False, name="hvdkeras.loop_sync")
            flag.assign(False)
            return tf.constant(True)

        tf.cond(flag, broadcast, lambda: tf.constant(False))
    else:
        with tf.init_scope():
            collectives.broadcast_variables(everything, root_rank=0, name="hvdkeras.loop_sync")
        synced.update(key)
    if not _state["split_any"] and not _state["explicit"] and "not-split" not in _state["warned"]:
        _state["warned"].add("not-split")
        if rank_zero.is_rank_zero():
            warnings.warn(NOT_SPLIT, stacklevel=4)
