"""The reducer interface: how the gradients of one step become the same update on every worker.

A reducer sits between the gradients and the optimizer that applies them. DistributedOptimizer's `apply` is
accumulate, `reduce`, the inner optimizer's update of what `reduce` returned, `after_apply`; a
DistributedGradientTape and unmodified loops reduce through the same reducers. A reducer is plain TensorFlow
and knows no optimizer: its inputs are gradients and variables.

- `build(variables)`: once, over the variables it will reduce the gradients of; it makes any state it needs
  as variables (`state()` lists them, for checkpoints).
- `updated(variables)`: which of them this worker's optimizer updates (every one, unless the reducer gives
  each worker its own share, as the reduce-scatter does).
- `reduce(grads, variables, name)`: the gradients in; the reduced gradients of the variables this worker
  updates out, with whatever `after_apply` needs (`Reduced`).
- `after_apply(reduced)`: a step after the update (the reduce-scatter's all-gather of the updated variables).
- `shard`: who owns which variable (a `reduce_scatter.Shard`), or None where every worker updates every one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence


@dataclasses.dataclass
class Reduced:
    """What `Reducer.reduce` returns: the gradients and variables the optimizer applies (in the same order),
    and what the reducer's `after_apply` needs (its own, opaque to the caller)."""

    grads: list
    variables: list
    pending: Any = None


class Reducer:
    """The interface (see the module's doc). Subclasses implement `reduce`; the rest has defaults."""

    shard: Any = None

    def build(self, variables: Sequence[Any]) -> None:
        """Called once with the variables whose gradients it reduces, before the first `reduce`."""

    def updated(self, variables: Sequence[Any]) -> list:
        """The variables of `variables` this worker's optimizer updates (built on, applied to)."""
        return list(variables)

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any], name: str = "hvdkeras.gradients") -> Reduced:
        """One step's gradients (a tensor, tf.IndexedSlices or None per variable) reduced across the workers.

        `name` prefixes the collectives' names: the same on every worker, distinct for reductions that may run
        at the same time (Horovod matches collectives by name)."""
        raise NotImplementedError

    def after_apply(self, reduced: Reduced) -> None:
        """Runs after the optimizer applied `reduced` (its result from `reduce`)."""

    def state(self) -> list:
        """The variables that hold this reducer's own state across steps (saved with the optimizer)."""
        return []
