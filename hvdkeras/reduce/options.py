"""The options of a reduction: every DistributedOptimizer parameter (and a DistributedGradientTape's), checked
once when made and frozen after. Every reducer reads them."""

from __future__ import annotations

import dataclasses
from typing import Any

from hvdkeras import _collectives as C
from hvdkeras import compression as _compression
from hvdkeras import settings
from hvdkeras._checks import check_int, check_number
from hvdkeras.variables import var_id

OP_NAMES = dict(C.REDUCE_OPS)
OPS_BY_NAME = {name: op for op, name in OP_NAMES.items()}

def default_bucket_bytes() -> int:
    """The bucket size when none is passed: $HVDKERAS_BUCKET_BYTES (as this process read it, settings.current),
    else settings.DEFAULT_BUCKET_BYTES (chosen by measurement on two hosts over a shaped link:
    benchmarks/network_benchmark.py, docs/network.md)."""
    return settings.current().bucket_bytes


def _check_groups(groups: Any) -> Any:
    if groups is None:
        return None
    if isinstance(groups, int) and not isinstance(groups, bool):
        return check_int("groups", groups)
    if isinstance(groups, (list, tuple)) and all(isinstance(g, (list, tuple)) for g in groups):
        seen: set[int] = set()
        for group in groups:
            for var in group:
                key = var_id(var)
                if key in seen:
                    raise ValueError(
                        f"`groups` lists a variable more than once. Received: variable={getattr(var, 'path', var)!r}"
                    )
                seen.add(key)
        return tuple(tuple(g) for g in groups)
    raise ValueError(
        "`groups` must be None, an integer >= 1 or a list of lists of variables. "
        f"Received: groups={groups!r}"
    )


@dataclasses.dataclass(frozen=True)
class ReductionOptions:
    """Every parameter of a DistributedOptimizer, checked when made; see DistributedOptimizer for each.

    `groups` is None, an int, or a tuple of tuples of variables. `bucket_bytes=None` reads the default
    ($HVDKERAS_BUCKET_BYTES or DEFAULT_BUCKET_BYTES) once, here. `compression` may be given as a name.

    Raises:
        ValueError, TypeError: an invalid option, naming it and what was received.
    """

    compression: Any = _compression.Compression.none
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0
    op: int = C.Average
    backward_passes_per_step: int = 1
    average_aggregated_gradients: bool = False
    groups: Any = None
    device_dense: str = ""
    device_sparse: str = ""
    process_set: Any = C.global_process_set
    scale_local_gradients: bool = True
    bucket_bytes: int | None = None
    shard_optimizer_state: bool = False

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        put("compression", _compression.get(self.compression))
        put("op", C.check_op(self.op))
        put("backward_passes_per_step", check_int("backward_passes_per_step", self.backward_passes_per_step))
        put("gradient_predivide_factor",
            check_number("gradient_predivide_factor", self.gradient_predivide_factor, exclusive=True))
        if self.gradient_predivide_factor != 1.0 and self.op != C.Average:
            raise ValueError(
                "`gradient_predivide_factor` other than 1.0 requires op=hvdkeras.Average. "
                f"Received: op={OP_NAMES[self.op]}, gradient_predivide_factor={self.gradient_predivide_factor}"
            )
        put("groups", _check_groups(self.groups))
        if not isinstance(self.process_set, C.ProcessSet):
            raise TypeError(
                f"`process_set` must be an hvdkeras.ProcessSet. Received: process_set={self.process_set!r}")
        bucket = default_bucket_bytes() if self.bucket_bytes is None else check_int(
            "bucket_bytes", self.bucket_bytes, 0, unit="bytes",
            hint="(0: one allreduce for all gradients, after the whole backward pass)")
        put("bucket_bytes", bucket)
        for flag in ("sparse_as_dense", "average_aggregated_gradients", "scale_local_gradients",
                     "shard_optimizer_state"):
            put(flag, bool(getattr(self, flag)))
        if self.shard_optimizer_state and self.process_set is not C.global_process_set:
            raise ValueError(
                "shard_optimizer_state=True shards the state over all workers, so it takes the global process "
                f"set only. Received: process_set={self.process_set!r}")

    @classmethod
    def from_horovod(cls, num_groups: int = 0, groups: Any = None, **options: Any) -> "ReductionOptions":
        """The options from Horovod's parameters, where `num_groups` is the deprecated form of `groups=n`."""
        check_int("num_groups", num_groups, 0)
        if num_groups and groups is not None:
            raise ValueError(f"Pass `groups` or the deprecated `num_groups`, not both. Received: num_groups="
                             f"{num_groups}, groups={groups!r}")
        return cls(groups=num_groups or groups, **options)

    def to_config(self) -> dict:
        """The serializable options (what DistributedOptimizer.get_config records)."""
        return {
            "compression": _compression.name_of(self.compression),
            "op": OP_NAMES[self.op],
            "backward_passes_per_step": self.backward_passes_per_step,
            "average_aggregated_gradients": self.average_aggregated_gradients,
            "sparse_as_dense": self.sparse_as_dense,
            "gradient_predivide_factor": self.gradient_predivide_factor,
            "groups": self.groups if isinstance(self.groups, int) else None,
            "bucket_bytes": self.bucket_bytes,
            "shard_optimizer_state": self.shard_optimizer_state,
        }
