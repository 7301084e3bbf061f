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
- `bind(options, local)`: the DistributedOptimizer's (or tape's) options and local variables, for a reducer
  made without its own (`bind_defaults`).

`updates_after_apply` says whether the reducer's work needs the step after the update (a tape, which sees no
update, cannot use such a reducer); `averages` whether it averages whatever the options' `op` says;
`updates_locally` whether each worker updates from its own gradients between synchronisations (the inner
optimizer's slots are then each worker's own, and checkpoints hold every worker's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from hvdkeras import _collectives as C
from hvdkeras.reduce.options import OP_NAMES, ReductionOptions


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
    updates_after_apply: bool = False
    averages: bool = False
    updates_locally: bool = False

    def bind_defaults(self, options: ReductionOptions | None, local: Callable[[], Any] | None) -> None:
        """Keeps the options and local variables the reducer was made with; those not given come from `bind`
        (`ReductionOptions()` and none until then).

        Raises:
            TypeError: `options` is not a ReductionOptions, or `local` not a function.
            ValueError: the reducer averages, and the options' `op` is not Average.
        """
        if options is not None and not isinstance(options, ReductionOptions):
            raise TypeError(f"`options` must be an hvdkeras.reduce.ReductionOptions or None. Received: "
                            f"options={options!r}")
        if local is not None and not callable(local):
            raise TypeError(f"`local` must be a function returning the var_ids of local variables, or None. "
                            f"Received: local={local!r}")
        self._own = (options is not None, local is not None)
        self.options = options or ReductionOptions()
        self._local = local or frozenset
        self._check_op()

    def bind(self, options: ReductionOptions, local: Callable[[], Any] = frozenset) -> None:
        """The options and local variables of the DistributedOptimizer or tape the reducer serves, where it was
        made without its own.

        Raises:
            ValueError: the reducer averages, and the options' `op` is not Average (naming both).
        """
        own_options, own_local = getattr(self, "_own", (True, True))
        if not own_options:
            self.options = options
        if not own_local:
            self._local = local
        self._check_op()

    def _check_op(self) -> None:
        if self.averages and self.options.op != C.Average:
            raise ValueError(f"{type(self).__name__} averages the workers' gradients or variables, so it takes "
                             f"op=hvdkeras.Average only. Received: {self!r} with "
                             f"op=hvdkeras.{OP_NAMES[self.options.op]}")

    def build(self, variables: Sequence[Any]) -> None:
        """Called once with the variables whose gradients it reduces, before the first `reduce`."""
        return None  # a body AutoGraph can convert (a docstring alone it cannot)

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
        return None

    def state(self) -> list:
        """The variables that hold this reducer's own state across steps (saved with the optimizer)."""
        return []

    def worker_state(self) -> list:
        """Those of `state()` whose values are each worker's own (PowerSGD's error feedback): a checkpoint
        holds every worker's, gathered (`DistributedOptimizer.consolidate_state`), and each worker loads its own."""
        return []

    def resized(self, old_size: int, new_size: int) -> None:
        """Called when the job changed from `old_size` to `new_size` workers (an elastic reset, or a checkpoint
        of another size loaded): each worker's own state no longer matches a worker, so it is reset."""
        return None
