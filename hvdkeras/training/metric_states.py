"""Metric results of all the workers' data: the metrics' states reduced across the workers, then the results
computed from them, exactly as one process that saw every worker's data would compute them."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.variables import to_tensor

# How Keras says a state combines across replicas (keras.Variable.aggregation).
_OPS = {"sum": C.Sum, "mean": C.Average}


def _metric_variables(metrics: Sequence[Any]) -> list:
    seen, out = set(), []
    for metric in metrics:
        for var in metric.variables:
            if id(var) not in seen:
                seen.add(id(var))
                out.append(var)
    return out


def global_result(metrics: Sequence[Any], local_result: Callable[[], Any], name: str = "hvdkeras.metrics",
                  device: str = "") -> Any:
    """`local_result()` computed from the states of all workers together. Collective: every worker calls it.

    Every state with `aggregation="sum"` (totals, counts, confusion counts: what Keras metrics keep) is
    summed across workers and "mean" states are averaged; the results are computed from those states,
    then each worker's own states are put back, so calling this twice counts nothing twice.

    Args:
        metrics: the metrics whose states `local_result` reads.
        local_result: computes the result(s) from the states as they are.
        name: the collectives' name prefix (the same on every worker).
        device: the device for the reductions ("" lets TensorFlow choose).
    """
    variables = [v for v in _metric_variables(metrics) if v.aggregation in _OPS]
    if not variables or C.size() == 1:
        return local_result()
    local = [tf.identity(to_tensor(v)) for v in variables]
    groups: dict = {}
    for i, var in enumerate(variables):
        groups.setdefault((_OPS[var.aggregation], var.dtype), []).append(i)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))
    for k, ((op, _), indices) in enumerate(ordered):
        with tf.device(device):
            reduced = C.grouped_allreduce([local[i] for i in indices], op=op, name=f"{name}.{k}")
        for i, value in zip(indices, reduced):
            variables[i].assign(value)
    try:
        return local_result()
    finally:
        for var, value in zip(variables, local):
            var.assign(value)
