"""What the periodic reducers share (post-local SGD, DiLoCo): they act after the update, average, and average a
model's non-trainable state with the variables at every synchronisation (`average_also`)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import tensorflow as tf

from hvdkeras.reduce.allreduce import average_variables
from hvdkeras.reduce.base import Reducer
from hvdkeras.variables import var_id

log = logging.getLogger("hvdkeras")


class PeriodicReducer(Reducer):
    """A reducer whose workers update alone between synchronisations, every `period` updates."""

    updates_after_apply = True
    averages = True
    updates_locally = True
    _also: Callable[[], Sequence[Any]] | None = None

    def resized(self, old_size: int, new_size: int) -> None:
        if old_size != new_size:
            log.warning("hvdkeras: %r: the job went from %d to %d workers; every worker continues from rank 0's "
                        "variables and optimizer slots (each worker's own copies do not carry over)", self,
                        old_size, new_size)

    def average_also(self, variables: Any) -> None:
        """Variables averaged plainly at every synchronisation, besides those the optimizer updates: a model's
        non-trainable state, such as BatchNormalization's moving statistics, which the workers' local steps
        move apart. Those of a model compiled with the optimizer are given by hvdkeras (its callbacks and
        `hvdkeras run`); a custom loop passes `model.non_trainable_variables`.

        Args:
            variables: a list of variables, or a function returning one (read when the synchronisation is
                traced, after the model is built). Only floating-point ones are averaged.

        Raises:
            TypeError: `variables` is neither a list (or tuple) nor a function.
        """
        if callable(variables):
            self._also = variables
        elif isinstance(variables, (list, tuple)):
            fixed = list(variables)
            self._also = lambda: fixed
        else:
            raise TypeError(f"`variables` must be a list of variables or a function returning one. Received: "
                            f"variables={variables!r}")

    @property
    def averages_extra(self) -> bool:
        """Whether `average_also` has been given variables to average besides the updated ones."""
        return self._also is not None

    def also_averaged(self, exclude: Sequence[Any] = ()) -> list:
        """The variables `average_also` names that are floating-point, not local and not in `exclude`, once each."""
        if self._also is None:
            return []
        seen = {var_id(v) for v in exclude} | set(self._local() or ())
        out = []
        for v in self._also() or ():
            key = var_id(v)
            if key not in seen and tf.as_dtype(v.dtype).is_floating:
                seen.add(key)
                out.append(v)
        return out

    def average_into(self, variables: Sequence[Any], name: str, into: Sequence[Any] | None = None) -> None:
        """Assigns each variable (or its counterpart in `into`) the workers' average of it (one grouped
        allreduce per group)."""
        variables = list(variables)
        if variables:
            for target, value in zip(variables if into is None else into,
                                     average_variables(variables, self.options, name)):
                target.assign(value)


def when(condition: Any, action: Callable[[], None]) -> None:
    """Runs `action` (a synchronisation, whose collectives every worker runs alike) where `condition` holds, in a
    traced step as eagerly."""

    def run() -> tf.Tensor:
        action()
        return tf.constant(True)

    tf.cond(condition, run, lambda: tf.constant(False))
