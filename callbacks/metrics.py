"""Exact global metrics: reduce metric states across workers, then compute the results."""

from __future__ import annotations

import tensorflow as tf

from hvdkeras import _collectives as C

from ._base import HvdCallback

# How Keras says a state combines across replicas (keras.Variable.aggregation).
_OPS = {"sum": C.Sum, "mean": C.Average}


def _metric_variables(metrics) -> list:
    seen, out = set(), []
    for metric in metrics:
        for var in metric.variables:
            if id(var) not in seen:
                seen.add(id(var))
                out.append(var)
    return out


def global_metrics_result(model, local_result, device: str = ""):
    """The model's metric results computed from the states of all workers together.

    Every state with `aggregation="sum"` (totals, counts, confusion counts: what Keras metrics keep) is
    summed across workers and "mean" states are averaged; the results are computed from those states,
    then each worker's own states are put back, so calling this twice counts nothing twice.
    """
    variables = [v for v in _metric_variables(model.metrics) if v.aggregation in _OPS]
    if not variables or C.size() == 1:
        return local_result()
    local = [tf.identity(v.value) for v in variables]
    groups: dict = {}
    for i, var in enumerate(variables):
        groups.setdefault((_OPS[var.aggregation], var.dtype), []).append(i)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))
    for k, ((op, _), indices) in enumerate(ordered):
        with tf.device(device):
            reduced = C.grouped_allreduce([local[i] for i in indices], op=op, name=f"hvdkeras.metrics.{k}")
        for i, value in zip(indices, reduced):
            variables[i].assign(value)
    try:
        result = local_result()
        return {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in result.items()}
    finally:
        for var, value in zip(variables, local):
            var.assign(value)


class MetricAverageCallback(HvdCallback):
    """Makes the epoch metrics in `logs` those of the whole global dataset, on every rank.

    Instead of averaging each worker's metric values (wrong for non-linear metrics such as Precision or AUC
    and for shards of different sizes), the metric states are reduced across workers and the metrics
    recomputed from them, exactly as one process evaluating the union would. Keras reads the metrics once
    per epoch for training and once per evaluation; while this callback is active those reads return the
    global values, so every callback in the list sees them whatever its position (EarlyStopping then stops
    all ranks at the same epoch), and so do `History` and `evaluate`'s return value.

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
            return global_metrics_result(model, original, self.device)

        get_metrics_result._hvdkeras_local = original
        self._original = original
        model.get_metrics_result = get_metrics_result

    def _uninstall(self):
        self._depth -= 1
        if self._depth == 0 and self._original is not None:
            # Dropping the instance attribute restores the class method.
            self.model.__dict__.pop("get_metrics_result", None)
            self._original = None

    def on_train_begin(self, logs=None):
        self._install()

    def on_train_end(self, logs=None):
        self._uninstall()

    def on_test_begin(self, logs=None):
        self._install()

    def on_test_end(self, logs=None):
        self._uninstall()
