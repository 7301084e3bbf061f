"""Exact global metrics: reduce metric states across workers, then compute the results."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.training import metric_states

from ._base import HvdCallback


def global_metrics_result(model, local_result, device: str = ""):
    """The model's metric results computed from the states of all workers together (see
    `metric_states.global_result`), as numpy values."""
    result = metric_states.global_result(model.metrics, local_result, device=device)
    return {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in result.items()}


class MetricAverageCallback(HvdCallback):
    """Makes the epoch metrics in `logs` those of the whole global dataset, on every rank.

    Instead of averaging each worker's metric values (wrong for non-linear metrics such as Precision or AUC
    and for shards of different sizes), the metric states are reduced across workers and the metrics
    recomputed from them, exactly as one process evaluating the union would. Keras reads the metrics once
    per epoch for training and once per evaluation; while this callback is active those reads return the
    global values, so every callback in the list sees them whatever its position (EarlyStopping then stops
    all ranks at the same epoch), and so do `History` and `evaluate`'s return value.

    A custom `train_step` / `test_step` may return plain values that are no metric's result (a GAN's
    `{"d_loss": d_loss, "g_loss": g_loss}`): Keras then reports the last batch's values, and this callback
    averages those over the workers in the epoch's and the evaluation's logs, so they are global on every
    rank too (callbacks after this one in the list see the averages).

    The per-batch values in the progress bar stay local.

    Args:
        device: the device for the reductions ("" lets TensorFlow choose), as in Horovod.

    Example:
        >>> model.fit(ds, validation_data=val, callbacks=[hvdkeras.callbacks.MetricAverageCallback()])
    """

    def __init__(self, device: str = ""):
        super().__init__()
        self.device = device
        self._depth = 0
        self._original = None
        self._global: dict = {}  # the latest global metric results: values in logs that need no averaging
        self._validation: dict = {}  # the last evaluation's logs, made global already, as fit names them

    def _install(self):
        self._depth += 1
        if self._depth > 1:
            return
        model = self.model
        original = model.get_metrics_result
        # A fit interrupted by an exception (an elastic reset, say) never reached on_train_end: never wrap
        # our own wrapper again, which would reduce twice.
        original = getattr(original, "_hvdkeras_local", original)

        def get_metrics_result():
            # Inside a traced step (Keras calls this from compute_metrics) stay local: no collectives in
            # the step graph. Only the eager end-of-epoch / end-of-evaluation reads are global.
            if not tf.executing_eagerly():
                return original()
            result = global_metrics_result(model, original, self.device)
            self._global.update(result)
            return result

        get_metrics_result._hvdkeras_local = original
        self._original = original
        model.get_metrics_result = get_metrics_result

    def _uninstall(self):
        self._depth -= 1
        if self._depth == 0 and self._original is not None:
            # Dropping the instance attribute restores the class method.
            self.model.__dict__.pop("get_metrics_result", None)
            self._original = None

    def _average_plain_logs(self, logs, known: dict, name: str) -> None:
        """Averages the float values of `logs` that are not the global values in `known`, in place."""
        if logs is None or C.size() == 1:
            return
        # Keras reports a custom step's own values when they are not exactly the metrics' results: a value
        # is global when it is the one the global results gave.
        keys = sorted(k for k, v in logs.items() if _is_float_scalar(v) and not (k in known and known[k] == v))
        if not keys:
            return
        with tf.device(self.device):
            averaged = C.allreduce(tf.constant([float(logs[k]) for k in keys], tf.float64), op=C.Average,
                                   name=f"hvdkeras.logs.{name}")
        for key, value in zip(keys, averaged.numpy()):
            logs[key] = float(value)

    def on_train_begin(self, logs=None):
        self._install()

    def on_train_end(self, logs=None):
        self._uninstall()

    def on_test_begin(self, logs=None):
        self._install()

    def on_test_end(self, logs=None):
        self._average_plain_logs(logs, self._global, "test")
        self._validation = {f"val_{k}": v for k, v in (logs or {}).items()}
        self._uninstall()

    def on_epoch_end(self, epoch, logs=None):
        known = {**self._global, **self._validation}
        if logs and "learning_rate" in logs:
            known["learning_rate"] = logs["learning_rate"]  # the same on every rank
        self._average_plain_logs(logs, known, "epoch")


def _is_float_scalar(value) -> bool:
    array = np.asarray(value)
    return array.ndim == 0 and array.dtype.kind == "f"
