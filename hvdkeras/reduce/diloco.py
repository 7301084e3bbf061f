"""The DiLoCo reducer (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models"): each worker takes `period` steps of the script's own optimizer (the inner optimizer) on its own
gradients; then the workers' average change since the last synchronisation is the gradient of an outer SGD with
Nesterov momentum, whose step from the last synchronised variables gives every worker the same new variables.

The variables a synchronisation starts from (the anchor) are kept once per variable, and set at the first update
to the workers' average, so a script that broadcasts after its first step (Horovod's pattern) still starts every
worker from the same anchor. With `outer_learning_rate=1` and `outer_momentum=0` a synchronisation is the plain
average of the workers' variables (post-local SGD's).

Its state, the count of updates, the anchors and the outer momentum, is variables (`state()`), saved with the
optimizer and restored with it. The variables the optimizer updates take the outer step; a model's
non-trainable state (BatchNormalization's moving statistics: `average_also`, given by hvdkeras for a model
compiled with the optimizer) is averaged plainly at each synchronisation.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from hvdkeras._checks import check_int, check_number
from hvdkeras.reduce.allreduce import average_variables
from hvdkeras.reduce.base import Reduced
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.reduce.periodic import PeriodicReducer, when
from hvdkeras.variables import var_id


class DiLoCoReducer(PeriodicReducer):
    """`period` local steps of the inner optimizer, then an outer Nesterov-momentum SGD step on the average change.

    Args:
        period: synchronise every this many updates (an integer >= 1; the paper's H, 500 for its language models).
        outer_learning_rate: the outer SGD's learning rate (a number > 0; the paper's 0.7).
        outer_momentum: the outer SGD's momentum (in [0, 1); the paper's 0.9).
        nesterov: whether the outer momentum is Nesterov's (the paper's choice).
        options: the buckets, process set and device of the averaging (default: the DistributedOptimizer's own;
            `ReductionOptions()` elsewhere). It averages: `op` must be Average.
        local: a function returning the `var_id`s of variables every worker keeps its own of (never averaged;
            default: the DistributedOptimizer's local variables).

    Raises:
        ValueError: an argument out of range, naming what was received.

    Example:
        >>> opt = hvdkeras.DistributedOptimizer(keras.optimizers.AdamW(1e-3),
        ...                                     reducer=hvdkeras.reduce.DiLoCoReducer(period=100))
    """

    def __init__(self, period: int, outer_learning_rate: float = 0.7, outer_momentum: float = 0.9,
                 nesterov: bool = True, options: ReductionOptions | None = None,
                 local: Callable[[], Any] | None = None):
        self.period = check_int("period", period, 1)
        self.outer_learning_rate = check_number("outer_learning_rate", outer_learning_rate, exclusive=True)
        momentum = check_number("outer_momentum", outer_momentum, 0.0)
        if momentum >= 1:
            raise ValueError(f"`outer_momentum` must be in [0, 1). Received: outer_momentum={outer_momentum!r}")
        self.outer_momentum = momentum
        self.nesterov = bool(nesterov)
        self.bind_defaults(options, local)
        self.steps: tf.Variable | None = None
        self._shared: list = []
        self.anchors: list = []
        self.momenta: list = []

    def __repr__(self) -> str:
        return (f"DiLoCoReducer(period={self.period}, outer_learning_rate={self.outer_learning_rate}, "
                f"outer_momentum={self.outer_momentum}, nesterov={self.nesterov})")

    def build(self, variables: Sequence[Any]) -> None:
        if self.steps is not None:
            return
        local = self._local() or frozenset()
        self._shared = [v for v in variables if var_id(v) not in local]
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="diloco_updates")
        self.anchors = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="diloco_anchor")
                        for v in self._shared]
        self.momenta = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="diloco_momentum")
                        for v in self._shared]

    def state(self) -> list:
        return [] if self.steps is None else [self.steps, *self.anchors, *self.momenta]

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any], name: str = "hvdkeras.gradients") -> Reduced:
        if self._shared:
            when(tf.equal(self.steps, 0),
                 lambda: self.average_into(self._shared, "hvdkeras.diloco.anchor", into=self.anchors))
        return Reduced(list(grads), list(variables))

    def after_apply(self, reduced: Reduced) -> None:
        steps = self.steps.assign_add(1)
        also = self.also_averaged(self._shared)
        if not self._shared and not also:
            return
        lr, mu = self.outer_learning_rate, self.outer_momentum

        def synchronise():
            averages = average_variables(self._shared, self.options, "hvdkeras.diloco")
            for v, a, m, average in zip(self._shared, self.anchors, self.momenta, averages):
                delta = tf.convert_to_tensor(a) - average  # the outer gradient: the average change, negated
                velocity = m.assign(mu * m - lr * delta)
                a.assign_add(mu * velocity - lr * delta if self.nesterov else velocity)
                v.assign(a)
            self.average_into(also, "hvdkeras.diloco.also")

        when(tf.equal(steps % self.period, 0), synchronise)
