"""What every reducer and its callers share about a reduction in progress: the gradients already reduced (so
none is reduced twice), whether an optimizer's `apply` that reduces is running, and whether the code being
traced is XLA-compiled (where Horovod's collectives cannot be)."""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Sequence

import tensorflow as tf
from tensorflow.python.ops import control_flow_util

# The gradients a reducer returned, by id, while they live: a DistributedGradientTape's gradients handed
# to a DistributedOptimizer are not reduced a second time (with op=Sum that would multiply them by the workers).
_reduced: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def is_reduced(grad: Any) -> bool:
    """Whether `grad` is a gradient a reducer returned (already the same on every worker)."""
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
