"""The post-local SGD reducer (Lin et al. 2018, "Don't use large mini-batches, use local SGD"; PyTorch's
PostLocalSGDOptimizer with a PeriodicModelAverager): the exact allreduce for the first `warmup_steps` updates,
then each worker updates its own copy from its own gradients, and every `period` updates the workers' variables
are averaged. Between two averagings the copies differ; right after each one they are identical.

On a slow link this sends the variables once every `period` updates instead of the gradients every update.
With `period=1` and plain SGD it is the exact allreduce (averaging the variables after one local step of each
worker from the same variables is averaging the gradients), to float tolerance.

Its state, the count of updates, is a variable (`state()`), saved with the optimizer and restored with it. The
variables the optimizer updates are averaged, and with them a model's non-trainable state (BatchNormalization's
moving statistics: `average_also`, given by hvdkeras for a model compiled with the optimizer).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from hvdkeras._checks import check_int
from hvdkeras.reduce.allreduce import reduce_gradients
from hvdkeras.reduce.base import Reduced
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.reduce.periodic import PeriodicReducer, when
from hvdkeras.variables import var_id


class LocalSGDReducer(PeriodicReducer):
    """Exact for `warmup_steps` updates, then local updates with the variables averaged every `period` updates.

    Args:
        period: average the workers' variables every this many updates (an integer >= 1).
        warmup_steps: updates with the exact allreduce of the gradients first (an integer >= 0).
        options: the buckets, process set and compression of the exact reduction and of the averaging (default:
            the DistributedOptimizer's own; `ReductionOptions()` elsewhere). It averages: `op` must be Average.
        local: a function returning the `var_id`s of variables every worker keeps its own of (never averaged;
            default: the DistributedOptimizer's local variables).

    Raises:
        ValueError: `period` or `warmup_steps` is not an integer in range, naming what was received.

    Example:
        >>> opt = hvdkeras.DistributedOptimizer(keras.optimizers.SGD(0.1),
        ...                                     reducer=hvdkeras.reduce.LocalSGDReducer(period=8, warmup_steps=100))
    """

    def __init__(self, period: int, warmup_steps: int = 0, options: ReductionOptions | None = None,
                 local: Callable[[], Any] | None = None):
        self.period = check_int("period", period, 1)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        self.bind_defaults(options, local)
        self.steps: tf.Variable | None = None

    def __repr__(self) -> str:
        return f"LocalSGDReducer(period={self.period}, warmup_steps={self.warmup_steps})"

    def build(self, variables: Sequence[Any]) -> None:
        if self.steps is None:
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="local_sgd_updates")

    def state(self) -> list:
        return [] if self.steps is None else [self.steps]

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any], name: str = "hvdkeras.gradients") -> Reduced:
        variables = list(variables)
        grads = list(grads)
        if self.warmup_steps == 0:
            return Reduced(grads, variables)
        present = [i for i, g in enumerate(grads) if g is not None]
        # Both branches as dense tensors of the same structure (a sparse gradient is densified).
        dense = [tf.convert_to_tensor(grads[i]) for i in present]
        local = self._local() or frozenset()

        def exact():
            return reduce_gradients(dense, [variables[i] for i in present], self.options, local, name=name)

        chosen = tf.cond(self.steps < self.warmup_steps, exact, lambda: [tf.identity(g) for g in dense])
        out: list = [None] * len(grads)
        for i, g in zip(present, chosen):
            out[i] = g
        return Reduced(out, variables)

    def after_apply(self, reduced: Reduced) -> None:
        steps = self.steps.assign_add(1)
        local = self._local() or frozenset()
        shared = [v for v in reduced.variables if var_id(v) not in local]
        also = self.also_averaged(shared)
        if not shared and not also:
            return
        sync = tf.logical_and(steps > self.warmup_steps, (steps - self.warmup_steps) % self.period == 0)

        def average():
            self.average_into(shared, "hvdkeras.local_sgd")
            self.average_into(also, "hvdkeras.local_sgd.also")

        when(sync, average)
