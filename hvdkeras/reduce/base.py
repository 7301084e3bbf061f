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
- `shard`: who owns which variable (a `shard.Shard`), or None where every worker updates every one.
- `optimizer_state`: how the optimizer that applies the reduced gradients keeps its state (`OptimizerState`):
  whole on every worker, or in the owners' parts (the reduce-scatter's `sharded_state.ShardedState`).
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


class OptimizerState:
    """How the optimizer that applies a reducer's gradients keeps its state: whole, on every worker (this class:
    every reducer's but the reduce-scatter's), or in parts (`sharded_state.ShardedState`). DistributedOptimizer
    builds, updates, saves and loads its inner optimizer through this and never asks which it is.

    `collective`: whether a save or load needs every worker (a gather before rank 0 saves alone, a share after
    rank 0 loads alone). `compilable`: whether the update may be compiled with XLA (it holds no collective).
    `alone` (save, load): rank 0 saves or loads by itself, the other workers not taking part.
    """

    collective = False
    compilable = True

    def prepare(self, optimizer: Any) -> None:
        """Before the reducer is built: what the reducer must know of `optimizer` (the reduce-scatter: which
        variables its math may update in pieces)."""
        return None

    def build(self, optimizer: Any, updated: Sequence[Any]) -> Any:
        """The optimizer to apply the reduced gradients of `updated` (this worker's variables), built."""
        if not optimizer.built:  # e.g. restored by load_model, then wrapped
            optimizer.build(list(updated))
        return optimizer

    def rebuild(self, optimizer: Any, values: Any, root_rank: int) -> Any:
        """The optimizer for the workers there are now (after an elastic resize), its state from `values` (the
        full state `root_rank` holds, `gather`'s result). Collective where the state is in parts."""
        return optimizer

    def check_update(self, optimizer: Any, grads: Sequence[Any]) -> None:
        """Raises where this worker's update of `grads` would leave the other workers waiting."""
        return None

    def finalize(self, optimizer: Any, variables: Sequence[Any]) -> None:
        """The optimizer's last word on the model's variables after training (EMA's average, say)."""
        optimizer.finalize_variable_values(list(variables))

    def save(self, optimizer: Any, store: Any, alone: bool) -> None:
        """Writes the optimizer's full state into `store`, as a plain Keras optimizer of its kind saves it."""
        optimizer.save_own_variables(store)

    def load(self, optimizer: Any, store: Any, alone: bool) -> None:
        """Sets the optimizer's state from `store` (a full state, as `save` writes it)."""
        optimizer.load_own_variables(store)

    def gather(self, optimizer: Any) -> list:
        """The optimizer's full state, as numpy arrays in the order a plain Keras optimizer saves it."""
        return [v.numpy() for v in optimizer.variables]

    def consolidate(self, optimizer: Any) -> None:
        """Gathers the full state now, on every worker, for rank 0's next `save(alone=True)`."""
        return None

    def share_loaded(self, optimizer: Any, root_rank: int) -> bool:
        """Gives every worker its part of a state `root_rank` loaded alone; whether there was one."""
        return False

    def slots(self, optimizer: Any) -> list:
        """This worker's own slots, which differ between workers (empty where the state is whole)."""
        return []


class Reducer:
    """The interface (see the module's doc). Subclasses implement `reduce`; the rest has defaults."""

    shard: Any = None
    optimizer_state: OptimizerState = OptimizerState()  # keeps nothing of its own: one serves every reducer
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
