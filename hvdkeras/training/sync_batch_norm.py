"""Synchronized batch normalization: batch statistics over the global batch of all workers.

`SyncBatchNormalization` is Horovod's layer on Keras 3, and Keras's own
`keras.layers.BatchNormalization(synchronized=True)` is synchronized the same way once `hvdkeras.init()`
has run with more than one worker (`install()`; Keras alone synchronizes only under a tf.distribute
strategy, which hvdkeras does not use). Each worker sums its rows, squares and row count; one Sum allreduce
of the three gives the global mean and variance, exact for uneven per-worker batch sizes. The allreduce
has its gradient (the Sum allreduce of the upstream gradients), so the backward pass is that of one batch
norm over the global batch.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import patches


def _allreduce_sum(value: tf.Tensor, name: str) -> tf.Tensor:
    @tf.custom_gradient
    def reduce(t):
        def grad(upstream):
            return C.allreduce(upstream, op=C.Sum, name=f"{name}.grad")

        return C.allreduce(t, op=C.Sum, name=name), grad

    return reduce(value)


def synchronized_moments(inputs: tf.Tensor, axes: list[int], name: str, mask: Any = None) -> tuple:
    """Mean and variance of `inputs` over `axes` and over every worker's batch together.

    Args:
        inputs: this worker's batch.
        axes: the axes to reduce (those of the batch norm).
        name: the collective's name, the same on every worker for this layer.
        mask: optional mask of the rows that count (as Keras's BatchNormalization takes it).

    Returns:
        (mean, variance), each with the shape of the axes that are kept.
    """
    x = tf.cast(inputs, tf.float32) if inputs.dtype in (tf.float16, tf.bfloat16) else inputs
    if mask is None:
        weights = tf.ones_like(x)
    else:
        weights = tf.cast(tf.broadcast_to(tf.expand_dims(tf.cast(mask, x.dtype), -1), tf.shape(x)), x.dtype)
    total = tf.reduce_sum(x * weights, axis=axes)
    squares = tf.reduce_sum(tf.square(x) * weights, axis=axes)
    count = tf.reduce_sum(weights, axis=axes)
    reduced = _allreduce_sum(tf.stack([total, squares, count]), name)
    count = tf.maximum(reduced[2], keras.backend.epsilon())
    mean = reduced[0] / count
    variance = tf.maximum(reduced[1] / count - tf.square(mean), 0.0)
    return mean, variance


def _synchronizing() -> bool:
    return C.is_initialized() and C.size() > 1 and not tf.distribute.has_strategy()


def _layer_moments(layer, inputs, mask, keras_moments):
    if layer.synchronized and _synchronizing():
        return synchronized_moments(inputs, layer._reduction_axes, f"hvdkeras.sync_batch_norm.{layer.path}", mask)
    return keras_moments(layer, inputs, mask)


def install() -> None:
    """Makes Keras's own `BatchNormalization(synchronized=True)` synchronize across the workers.

    Installed by `hvdkeras.init()`; `patches.uninstall("sync_batch_norm")` undoes it. Layers made with
    `synchronized=False`, and every layer in a job of one worker, compute Keras's own moments.
    """
    if patches.installed("sync_batch_norm"):
        return
    keras_moments = keras.layers.BatchNormalization._moments

    def _moments(layer, inputs, mask):
        return _layer_moments(layer, inputs, mask, keras_moments)

    patches.install("sync_batch_norm", [(keras.layers.BatchNormalization, "_moments", _moments)])


@keras.saving.register_keras_serializable(package="hvdkeras")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization with the statistics of the global batch across all workers (Horovod's layer).

    Args:
        fused: must be False, as in Horovod (a fused kernel cannot be synchronized).
        **kwargs: as for `keras.layers.BatchNormalization`.

    Raises:
        ValueError: fused is not False.

    Example:
        >>> model = keras.Sequential([keras.layers.Conv2D(8, 3), hvdkeras.SyncBatchNormalization(), ...])
    """

    def __init__(self, fused: bool = False, **kwargs: Any):
        if fused is not False:
            raise ValueError(f"SyncBatchNormalization does not support fused=True. Received: fused={fused!r}")
        kwargs["synchronized"] = True
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        # Its own override, so this layer synchronizes whether or not `install()` patched Keras's layer.
        return _layer_moments(self, inputs, mask, keras.layers.BatchNormalization._moments)


def average_moving_statistics(model: Any) -> None:
    """Averages the moving mean and variance of the model's unsynchronized BatchNormalization layers
    across the workers, so the workers hold one model again.

    Each worker's moving statistics follow its own batches. Their update is the same affine map on every
    worker (`m * old + (1 - m) * batch statistic`), so the average taken once equals what averaging after
    every step gives: tf.distribute's MEAN aggregation of these variables. Synchronized layers (see
    `SyncBatchNormalization`) see the global batch and agree already.
    """
    if not C.is_initialized() or C.size() == 1:
        return
    variables = [v for layer in model._flatten_layers(include_self=True, recursive=True)
                 if isinstance(layer, keras.layers.BatchNormalization) and not getattr(layer, "synchronized", False)
                 and layer.built for v in (layer.moving_mean, layer.moving_variance)]
    if variables:
        averaged = C.grouped_allreduce([tf.convert_to_tensor(v) for v in variables], op=C.Average,
                                       name="hvdkeras.moving_statistics")
        for var, value in zip(variables, averaged):
            var.assign(value)
