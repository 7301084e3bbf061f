"""How gradients are reduced across workers: the options, once, and one small function per grouping.

`ReductionOptions` holds every DistributedOptimizer parameter, validated when it is made and frozen after.
`reduce_gradients(grads, variables, options)` all-reduces the dense gradients in groups (buckets in the
order the backward pass produces them, n even groups, or the user's lists) and allgathers the sparse ones.
It knows nothing of optimizers or Keras models: the optimizer calls it from `apply`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from typing import Any, Sequence

import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from hvdkeras import _collectives as C
from hvdkeras import compression as _compression
from hvdkeras import settings
from hvdkeras._checks import check_int, check_number
from hvdkeras.variables import var_id

OP_NAMES = dict(C.REDUCE_OPS)
OPS_BY_NAME = {name: op for op, name in OP_NAMES.items()}

def default_bucket_bytes(environ: Any = None) -> int:
    """The bucket size when none is passed: $HVDKERAS_BUCKET_BYTES, else settings.DEFAULT_BUCKET_BYTES (chosen
    by measurement on two hosts over a shaped link: benchmarks/network_benchmark.py, docs/network.md)."""
    return settings.read(environ).bucket_bytes


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


# ------------------------------------------------------------------------------------------------ grouping
def numel(var: Any) -> int:
    """How many elements a variable (or tensor) of a fully defined shape holds."""
    count = 1
    for dim in var.shape:
        count *= int(dim)
    return count


def _nbytes(var: Any) -> int:
    # A watched tensor of a tape may have an unknown dimension (the batch): it adds nothing to its bucket's fill.
    if not tf.TensorShape(var.shape).is_fully_defined():
        return 0
    return numel(var) * tf.as_dtype(var.dtype).size


def gradient_buckets(dense: Sequence[int], variables: Sequence[Any], bucket_bytes: int) -> list[list[int]]:
    """Cuts the dense gradients' indices into buckets, in the order the backward pass produces them.

    The backward pass runs from the model's last layer to its first, so the buckets take the variables in
    reverse order; a bucket closes once it holds `bucket_bytes` or more. `bucket_bytes=0` gives one bucket.
    The result depends only on the variables' order, shapes and dtypes, so it is the same on every worker.
    """
    if not dense:
        return []
    if not bucket_bytes:
        return [list(dense)]
    buckets, current, filled = [], [], 0
    for i in reversed(dense):
        current.append(i)
        filled += _nbytes(variables[i])
        if filled >= bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


def even_groups(dense: Sequence[int], n: int) -> list[list[int]]:
    """`groups=n`: n groups of about equal numbers of gradients, in the variables' order."""
    n = min(n, len(dense)) or 1
    step, extra = divmod(len(dense), n)
    groups, start = [], 0
    for k in range(n):
        end = start + step + (1 if k < extra else 0)
        groups.append(list(dense[start:end]))
        start = end
    return groups


def listed_groups(dense: Sequence[int], variables: Sequence[Any], listed: Sequence[Sequence[Any]]) -> list[list[int]]:
    """`groups=[[v, ...], ...]`: one group per list, in the lists' order; variables in no list alone."""
    where = {var_id(var): gi for gi, group in enumerate(listed) for var in group}
    by_group: dict[int, list[int]] = {}
    singles = []
    for i in dense:
        gi = where.get(var_id(variables[i]))
        if gi is None:
            singles.append([i])
        else:
            by_group.setdefault(gi, []).append(i)
    return [by_group[k] for k in sorted(by_group)] + singles


def dense_groups(dense: Sequence[int], variables: Sequence[Any], options: ReductionOptions) -> list[list[int]]:
    """The fused allreduces of the dense gradients: the options' grouping, each group split by dtype (Horovod
    fuses only tensors of one dtype per grouped call)."""
    if options.groups is None:
        groups = gradient_buckets(dense, variables, options.bucket_bytes)
    elif isinstance(options.groups, int):
        groups = even_groups(dense, options.groups)
    else:
        groups = listed_groups(dense, variables, options.groups)
    split = []
    for group in groups:
        by_dtype: dict[Any, list[int]] = {}
        for i in group:
            by_dtype.setdefault(variables[i].dtype, []).append(i)
        split.extend(by_dtype.values())
    return [g for g in split if g]


# ----------------------------------------------------------------------------------------------- reducing
# The gradients reduce_gradients returned, by id, while they live: a DistributedGradientTape's gradients handed
# to a DistributedOptimizer are not reduced a second time (with op=Sum that would multiply them by the workers).
_reduced: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def is_reduced(grad: Any) -> bool:
    """Whether `grad` is a gradient that reduce_gradients returned (already the same on every worker)."""
    return grad is not None and _reduced.get(id(grad)) is grad


def mark_reduced(grads: Sequence[Any]) -> None:
    """Marks tensors computed from reduced gradients alike on every worker (a clip of them) as reduced: an
    optimizer that gets them does not reduce them again."""
    for g in grads:
        if g is not None:
            _reduced[id(g)] = g


_depth = threading.local()


@contextlib.contextmanager
def reducing():
    """Marks an optimizer's `apply` that reduces its gradients: an optimizer it calls inside (the optimizer a
    DistributedOptimizer or a LossScaleOptimizer wraps) gets them reduced already."""
    _depth.value = getattr(_depth, "value", 0) + 1
    try:
        yield
    finally:
        _depth.value -= 1


def inside_reduction() -> bool:
    """Whether this code runs inside an optimizer's `apply` that reduces (see `reducing`)."""
    return getattr(_depth, "value", 0) > 0


def in_xla_context() -> bool:
    """Whether the code being traced is inside an XLA-compiled function (where Horovod's ops cannot be)."""
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def reduce_gradients(grads: Sequence[Any], variables: Sequence[Any], options: ReductionOptions,
                     local: frozenset[int] | set[int] = frozenset(), name: str = "hvdkeras.gradients") -> list:
    """All-reduces a list of gradients (None entries pass through) and returns the reduced list.

    The optimizer and the tape both reduce through here. A gradient this function returned before (a tape's,
    passed on to a DistributedOptimizer) passes through as it is.

    Args:
        grads: one gradient (a tensor, a tf.IndexedSlices or None) per variable.
        variables: the variables (or watched tensors), in the same order.
        options: how to reduce.
        local: `var_id`s of variables whose gradients stay on each worker (divided by the number of workers
            when `options.scale_local_gradients`).
        name: the collectives' name prefix: the same on every worker, and distinct for reductions that may run
            at the same time (Horovod matches collectives by name).
    """
    out = list(grads)
    dense, sparse = [], []
    for i, g in enumerate(out):
        if g is None or is_reduced(g):
            continue
        if local and var_id(variables[i]) in local:
            if options.scale_local_gradients:
                out[i] = _scale_local(g, options)
            continue
        if isinstance(g, tf.IndexedSlices):
            if options.sparse_as_dense:
                out[i] = tf.convert_to_tensor(g)
                dense.append(i)
            else:
                sparse.append(i)
        else:
            dense.append(i)
    for k, group in enumerate(dense_groups(dense, variables, options)):
        _reduce_dense(out, group, options, name=f"{name}.{k}")
    for i in sparse:
        out[i] = _reduce_sparse(out[i], options, name=f"{name}.sparse.{i}")
    mark_reduced([out[i] for i in [*dense, *sparse]])
    return out


def _scale_local(grad: Any, options: ReductionOptions) -> Any:
    size = tf.cast(C.size_tensor(options.process_set), grad.dtype)
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / size, grad.indices, dense_shape=grad.dense_shape)
    return grad / size


def _reduce_dense(out: list, indices: list[int], options: ReductionOptions, name: str) -> None:
    sent, ctxs = [], []
    for i in indices:
        t, ctx = options.compression.compress(tf.convert_to_tensor(out[i]))
        sent.append(t)
        ctxs.append(ctx)
    pre, post = 1.0, 1.0
    if options.op == C.Average:
        pre, post = 1.0 / options.gradient_predivide_factor, options.gradient_predivide_factor
    with tf.device(options.device_dense):
        reduced = C.grouped_allreduce(sent, op=options.op, prescale_factor=pre, postscale_factor=post, name=name,
                                      process_set=options.process_set)
    for i, t, ctx in zip(indices, reduced, ctxs):
        out[i] = options.compression.decompress(t, ctx)


def _reduce_sparse(grad: tf.IndexedSlices, options: ReductionOptions, name: str) -> tf.IndexedSlices:
    with tf.device(options.device_sparse):
        values = C.allgather(grad.values, name=f"{name}.values", process_set=options.process_set)
        indices = C.allgather(grad.indices, name=f"{name}.indices", process_set=options.process_set)
    if options.op == C.Average:
        values = values / tf.cast(C.size_tensor(options.process_set), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=grad.dense_shape)
