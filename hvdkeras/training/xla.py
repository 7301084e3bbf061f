"""XLA kept for a model's compute: the forward and backward pass compiled, the gradients reduced outside.

Horovod's collectives cannot be compiled by XLA, and Keras compiles the whole train step when a model's
`jit_compile` is on (`True`, or Keras's `"auto"` where a GPU is present), the optimizer's update included.
For a model whose train step is Keras's own, hvdkeras splits it:

1. a function compiled with XLA runs Keras's train step up to the update: the forward pass, the loss, its
   tracker, the metrics and the gradients; it returns the logs and the gradients;
2. outside it, in the same traced step, the DistributedOptimizer reduces the gradients; the inner optimizer's
   update is then compiled with XLA again, in a function of its own (not with a sharded state, whose update
   holds collectives).

The update is the optimizer's own either way, so the result is the synchronous optimizer's: the forward and
backward pass compute what Keras's compiled step computes, and the metrics see the same predictions (Keras
computes them after the update, from predictions made before it). Evaluation and prediction hold no
collective and stay compiled as Keras makes them.

What is lost: a bucket of gradients can only start when the compiled function returns all of them, so
communication no longer overlaps the backward pass (docs/gpu.md measures both ways). A model with its own
`train_step` cannot be split from outside, nor one whose synchronized batch normalization all-reduces in the
forward pass; XLA is turned off for those (models.prepare_xla).
"""

from __future__ import annotations

import types
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer


def why_not(model: Any) -> str:
    """Why the model's train step cannot be split around the reduction ("" when it can)."""
    if getattr(type(model), "train_step", None) is not TensorFlowTrainer.train_step:
        return "it has its own train_step, which hvdkeras cannot split around the reduction"
    if not callable(getattr(model, "_make_function", None)):
        return "this Keras makes its train function in a way hvdkeras does not know"
    synced = [layer.name for layer in model._flatten_layers(include_self=False, recursive=True)
              if isinstance(layer, keras.layers.BatchNormalization) and getattr(layer, "synchronized", False)]
    if synced:
        return (f"its synchronized batch normalization ({', '.join(synced)}) all-reduces in the forward pass, "
                "which XLA would compile")
    return ""


def is_split(model: Any) -> bool:
    return getattr(model, "_hvdkeras_xla_split", False)


def compiled_function(model: Any) -> Any:
    """The XLA-compiled forward and backward pass of a split model's current train function (a
    tf.function taking a batch and returning the logs and the gradients), or None before one was made."""
    return getattr(model, "_hvdkeras_xla_function", None)


def keep_xla(model: Any) -> bool:
    """Makes the model's train function compile its forward and backward pass with XLA and reduce and apply
    the gradients outside (when the model's `jit_compile` is on when the function is made).

    Returns False, changing nothing, for a model it cannot split (`why_not` says why).
    """
    if why_not(model):
        return False
    if not is_split(model):
        model._hvdkeras_xla_split = True
        model.make_train_function = types.MethodType(_make_train_function, model)
        model.train_function = None
    return True


def _make_train_function(model: Any, force: bool = False) -> Any:
    """Keras's make_train_function, with XLA around the forward and backward pass only."""
    if model.train_function is not None and not force:
        return model.train_function
    if hasattr(model.optimizer, "xla_update"):  # a DistributedOptimizer: its update, after the reduction, compiled
        model.optimizer.xla_update = bool(model.jit_compile)
    if not model.jit_compile:
        model._hvdkeras_xla_function = None
        return TensorFlowTrainer.make_train_function(model, force)
    compiled = tf.function(types.MethodType(_forward_backward, model), jit_compile=True, reduce_retracing=True)
    model._hvdkeras_xla_function = compiled  # what `compiled_function` returns

    def train_step(data):
        logs, grads = compiled(data)
        if grads:
            model.optimizer.apply_gradients(zip(grads, model.trainable_weights))
        return logs

    # Keras makes the step function (its tf.function, the loop over steps_per_execution) around train_step,
    # compiled with XLA when jit_compile is on: off while it is made, so only `compiled` is.
    model.jit_compile = False
    try:
        model.train_function = model._make_function(train_step)
    finally:
        model.jit_compile = True
    return model.train_function


def _forward_backward(model: Any, data: Any) -> tuple[Any, list]:
    """Keras's train step, with the optimizer's apply_gradients catching the gradients instead of applying
    them; runs (is traced) inside the XLA-compiled function."""
    caught: list = []
    optimizer = model.optimizer

    def catch(grads_and_vars):
        caught.extend(g for g, _ in grads_and_vars)

    optimizer.apply_gradients = catch
    try:
        logs = TensorFlowTrainer.train_step(model, data)
    finally:
        del optimizer.apply_gradients
    return logs, caught
