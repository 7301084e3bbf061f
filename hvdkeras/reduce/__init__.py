"""The reducers: how one step's gradients become the same update on every worker (`base.Reducer`).

- `AllreduceReducer` (allreduce.py): every worker gets every reduced gradient (the default);
- `ReduceScatterReducer` (reduce_scatter.py): each worker gets and updates its own share, then the updated
  variables are all-gathered (ZeRO; `shard_optimizer_state=True`);
- `LocalSGDReducer` (local_sgd.py): post-local SGD, the exact allreduce for a warm-up, then local updates with
  the variables averaged every `period` updates (for slow links);
- `PowerSGDReducer` (powersgd.py): gradient matrices sent as low-rank approximations with error feedback (for
  slow links);
- `DiLoCoReducer` (diloco.py): `period` local steps of the inner optimizer, then an outer Nesterov-momentum SGD
  step on the workers' average change (for slow links).

groups.py owns the buckets and groups of every reducer, options.py the options they read, context.py what
they share about a reduction in progress. Plain TensorFlow: nothing here imports an optimizer.
"""

from __future__ import annotations

from typing import Any, Callable

from hvdkeras import settings
from hvdkeras.reduce.allreduce import AllreduceReducer
from hvdkeras.reduce.base import Reduced, Reducer
from hvdkeras.reduce.diloco import DiLoCoReducer
from hvdkeras.reduce.local_sgd import LocalSGDReducer
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.reduce.periodic import PeriodicReducer
from hvdkeras.reduce.powersgd import PowerSGDReducer
from hvdkeras.reduce.reduce_scatter import ReduceScatterReducer

BUILT_IN = {"allreduce": AllreduceReducer, "reduce_scatter": ReduceScatterReducer}


SPEC_CLASSES = {"powersgd": PowerSGDReducer, "local_sgd": LocalSGDReducer, "diloco": DiLoCoReducer}


def from_spec(spec: str) -> Reducer | str:
    """The reducer `--reducer` names (settings.reducer_spec: NAME or NAME:KEY=VALUE,...): a built-in's name
    ("allreduce", "reduce_scatter"), or a new reducer made with the options given.

    Raises:
        ValueError: not a reducer's spec, or an option out of range, saying what was received.
    """
    try:
        name, options = settings.reducer_spec(spec)
    except ValueError as e:
        raise ValueError(f"--reducer must be NAME or NAME:KEY=VALUE,... that {e}. Received: {spec!r}") from None
    if name in BUILT_IN:
        return name
    return SPEC_CLASSES[name](**options)


def make_reducer(options: ReductionOptions, local: Callable[[], Any] = frozenset) -> Reducer:
    """The built-in reducer the options name: the reduce-scatter with `shard_optimizer_state`, else the
    allreduce."""
    return (ReduceScatterReducer if options.shard_optimizer_state else AllreduceReducer)(options, local)


__all__ = ["AllreduceReducer", "BUILT_IN", "DiLoCoReducer", "LocalSGDReducer", "PeriodicReducer", "PowerSGDReducer",
           "ReduceScatterReducer", "Reduced", "Reducer", "ReductionOptions", "SPEC_CLASSES", "from_spec",
           "make_reducer"]
