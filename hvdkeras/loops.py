"""Unmodified custom training loops under `hvdkeras run` / `python -m hvdkeras`: one model, not one per worker.

A loop that computes gradients with its own `tf.GradientTape` and applies them with a Keras optimizer
(`apply_gradients` or `apply`, eagerly or in a `tf.function`, in a `strategy.run` step too) would train one
model per worker. Installed as the patch "loops" (part of `wrap.install`), this makes every Keras optimizer's
`apply` data-parallel at the outermost optimizer:

- the gradients are all-reduced (averaged) across the workers before the update, through the same
  `reduction.reduce_gradients` as DistributedOptimizer, so a LossScaleOptimizer's finiteness check, gradient
  clipping and weight decay all see the reduced gradients and every rank skips an overflowing step together;
  an optimizer inside it (a LossScaleOptimizer's, a DistributedOptimizer's) is left alone, and gradients a
  DistributedGradientTape already reduced are not reduced again;
- before an optimizer first updates a variable, the variable and the optimizer's state are broadcast from
  rank 0, so every rank holds the same model from before the first update to the end (eagerly, or once when
  the step is first traced). A DistributedOptimizer is left to the script and to fit's callbacks, as before;
  `model.train_on_batch` broadcasts the model itself (wrap.py);
- the loop's data is not split: each worker computes every batch, which equals one process. Rank 0 warns once
  that the loop's data is not split, and what to change to split it.

Refused with one clear error: an update inside `tf.function(jit_compile=True)`, where Horovod's collectives
cannot be compiled.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import keras
import tensorflow as tf
from keras.src.optimizers.base_optimizer import BaseOptimizer

from hvdkeras import _collectives as C
from hvdkeras import collectives, patches, rank_zero, reduction
from hvdkeras.reduction import ReductionOptions
from hvdkeras.variables import var_id

log = logging.getLogger("hvdkeras")
PATCH = "loops"
_state: dict[str, Any] = {"options": None, "names": {}, "warned": set()}

NOT_SPLIT = (
    "hvdkeras: the script trains in a loop of its own (its optimizer's apply_gradients or apply): the loop's "
    "data is not split, so each worker computes every batch and the workers' gradients are averaged; the job "
    "trains one model, as one process would, at one process's speed. To split the data, pass it to "
    "model.fit, or shard it in the script (hvdkeras.data.shard(dataset) before batch(), or "
    "dataset.shard(hvdkeras.size(), hvdkeras.rank())) and run with --no-shard.")


def install(options: ReductionOptions | None = None) -> bool:
    """Makes every Keras optimizer's `apply` data-parallel in this process (see the module's docstring).

    Args:
        options: how the loops' gradients are reduced (default: DistributedOptimizer's defaults).
    """
    _state["options"] = options or ReductionOptions()
    changes = [(owner, "apply", _data_parallel(vars(owner)["apply"]))
               for owner in (BaseOptimizer, keras.optimizers.LossScaleOptimizer)]
    return patches.install(PATCH, changes)


def uninstall() -> bool:
    _state["names"].clear()
    return patches.uninstall(PATCH)


def _data_parallel(keras_apply):
    def apply(optimizer, grads, trainable_variables=None):
        if reduction.inside_reduction() or not C.is_initialized() or C.size() == 1:
            return keras_apply(optimizer, grads, trainable_variables)
        grads = list(grads)
        if not grads:
            return keras_apply(optimizer, grads, trainable_variables)
        if reduction.in_xla_context():
            raise RuntimeError(
                "The script applies gradients with a Keras optimizer inside tf.function(jit_compile=True), and "
                "hvdkeras must average them across the workers there with Horovod's collectives, which XLA "
                "cannot compile. Compile only the gradient computation (return the gradients from the "
                "jit_compile=True function and call optimizer.apply_gradients outside it), or use "
                "tf.function(jit_compile=False) for the step.")
        with reduction.reducing():
            variables = list(trainable_variables) if trainable_variables is not None else None
            if variables is None and optimizer.built:
                variables = list(optimizer._trainable_variables)
            if variables is None:  # Keras's own error: an unbuilt optimizer needs the variables
                return keras_apply(optimizer, grads, trainable_variables)
            _sync_before_first_update(optimizer, variables)
            reduced = reduction.reduce_gradients(grads, variables, _state["options"], name=_name_for(optimizer))
            return keras_apply(optimizer, reduced, trainable_variables)

    apply.__wrapped__ = keras_apply
    apply.__doc__ = keras_apply.__doc__
    return apply


def _name_for(optimizer: Any) -> str:
    """The collectives' names of an optimizer's reductions: by the order in which optimizers first apply, the
    same on every worker, and distinct for two optimizers whose updates may run at the same time (a GAN's)."""
    names = _state["names"]
    if id(optimizer) not in names:
        names[id(optimizer)] = f"hvdkeras.loop.{len(names)}"
    return names[id(optimizer)]


def _sync_before_first_update(optimizer: Any, variables: list) -> None:
    """Broadcasts rank 0's values of the variables this optimizer has not updated before, and its state, once.

    Eagerly, at the first update; in a tf.function, when the step is first traced (under tf.init_scope, so it
    runs then, once, before the traced step ever runs).
    """
    synced = optimizer.__dict__.setdefault("_hvdkeras_synced", set())
    new = [v for v in variables if var_id(v) not in synced]
    if not new:
        return
    with tf.init_scope():
        if not optimizer.built:
            optimizer.build(variables)
            optimizer.built = True
        collectives.broadcast_variables(new + list(optimizer.variables), root_rank=0)
    synced.update(var_id(v) for v in new)
    if "not-split" not in _state["warned"]:
        _state["warned"].add("not-split")
        if rank_zero.is_rank_zero():
            warnings.warn(NOT_SPLIT, stacklevel=4)
