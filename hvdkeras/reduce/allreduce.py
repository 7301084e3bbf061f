"""The allreduce reducer: every worker gets the average (or sum) of every gradient and updates every variable.

Dense gradients travel in fused allreduces, one per group of `groups.dense_groups` (by default buckets in the
order the backward pass produces them, each started as soon as its gradients exist); sparse ones
(tf.IndexedSlices) are allgathered, unless `sparse_as_dense`. Local variables' gradients stay on each worker.
This is DistributedOptimizer's reducer unless its state is sharded, a DistributedGradientTape's, and that of
unmodified loops under `hvdkeras run`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.reduce.base import Reduced, Reducer
from hvdkeras.reduce.context import is_reduced, mark_reduced
from hvdkeras.reduce.groups import dense_groups
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.variables import var_id


class AllreduceReducer(Reducer):
    """Reduces every gradient on every worker (`reduce_gradients`).

    Args:
        options: how to reduce (a ReductionOptions).
        local: a function returning the `var_id`s of the variables whose gradients stay on each worker (read
            at each reduction: layers may be built after the reducer is made).
    """

    def __repr__(self) -> str:
        return "AllreduceReducer()"

    def __init__(self, options: ReductionOptions, local: Callable[[], Any] = frozenset):
        self.options = options
        self._local = local

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any], name: str = "hvdkeras.gradients") -> Reduced:
        variables = list(variables)
        return Reduced(reduce_gradients(grads, variables, self.options, self._local() or frozenset(), name=name),
                       variables)


def reduce_gradients(grads: Sequence[Any], variables: Sequence[Any], options: ReductionOptions,
                     local: frozenset[int] | set[int] = frozenset(), name: str = "hvdkeras.gradients") -> list:
    """All-reduces a list of gradients (None entries pass through) and returns the reduced list.

    The allreduce reducer (under DistributedOptimizer, the tape and unmodified loops) reduces through here. A
    gradient a reducer returned before (a tape's, passed on to a DistributedOptimizer) passes through as it is.

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
                out[i] = scale_local(g, options)
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
        allreduce_group(out, group, options, name=f"{name}.{k}")
    for i in sparse:
        out[i] = allgather_sparse(out[i], options, name=f"{name}.sparse.{i}")
    mark_reduced([out[i] for i in [*dense, *sparse]])
    return out


def average_variables(variables: Sequence[Any], options: ReductionOptions, name: str) -> list:
    """The workers' average of each variable's value, in one grouped allreduce per group of `dense_groups` (the
    slow-link reducers' synchronisation). Returns the averages; assigns nothing."""
    out: list = [None] * len(variables)
    for k, group in enumerate(dense_groups(list(range(len(variables))), variables, options)):
        with tf.device(options.device_dense):
            averaged = C.grouped_allreduce([tf.convert_to_tensor(variables[i]) for i in group], op=C.Average,
                                           name=f"{name}.{k}", process_set=options.process_set)
        for i, value in zip(group, averaged):
            out[i] = value
    return out


def scale_local(grad: Any, options: ReductionOptions) -> Any:
    """A local variable's gradient divided by the number of workers (`scale_local_gradients`)."""
    size = tf.cast(C.size_tensor(options.process_set), grad.dtype)
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / size, grad.indices, dense_shape=grad.dense_shape)
    return grad / size


def allreduce_group(out: list, indices: list[int], options: ReductionOptions, name: str) -> None:
    """All-reduces `out[i]` for each index of one group in one fused allreduce (compressed, scaled), in place."""
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


def allgather_sparse(grad: tf.IndexedSlices, options: ReductionOptions, name: str) -> tf.IndexedSlices:
    """A sparse gradient's values and indices gathered from every worker (averaged with op=Average)."""
    with tf.device(options.device_sparse):
        values = C.allgather(grad.values, name=f"{name}.values", process_set=options.process_set)
        indices = C.allgather(grad.indices, name=f"{name}.indices", process_set=options.process_set)
    if options.op == C.Average:
        values = values / tf.cast(C.size_tensor(options.process_set), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=grad.dense_shape)
