"""The reduce-scatter reducer (ZeRO stages 1 and 2): each worker receives the reduced gradients of the pieces of
the variables it owns only, its optimizer updates those, and the updated pieces are all-gathered into every
worker's weights after the update. `DistributedOptimizer(shard_optimizer_state=True)` is this reducer; its
`optimizer_state` (sharded_state.py) keeps the optimizer's state in the owners' parts (docs/sharding.md).

Who owns what is shard.py's `partition`: whole variables where the optimizer's math needs them whole, runs of
rows of the others, so each worker owns about 1/N of the state (`Shard`). Every step:

1. The dense gradients are reduce-scattered in the buckets the allreduce reducer all-reduces them in
   (consecutive buckets merged until the workers' parts are about equal: `groups.balanced_groups`), each as
   soon as the backward pass has produced it: a group's gradients are packed by owner into one buffer of N
   equal parts (each padded to the longest), an alltoall sends each worker every copy of its part, and it sums
   them. A group whose padding would make it send more than an allreduce of it is all-reduced instead, and
   each worker keeps its own part.
2. Each worker's slice variables are set to their rows of the model's variables (`Shard.refresh`), and its
   optimizer updates the whole variables and slices it owns, in place.
3. `after_apply`: the updated pieces are all-gathered into every worker's weights, one allgather per dtype
   (above GATHER_BYTES of a dtype, one per group of step 1), before the next forward pass.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.reduce.allreduce import allgather_sparse, allreduce_group, reduce_gradients, scale_local
from hvdkeras.reduce.base import Reduced, Reducer
from hvdkeras.reduce.groups import balanced_groups, dense_groups, nbytes, parts, row_elements
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.reduce.shard import Shard, covers, pack, piece_rows
from hvdkeras.reduce.sharded_state import ShardedState
from hvdkeras.variables import var_id


# ------------------------------------------------------------------------------------------------ gradients
def reduce_scatter_gradients(grads: Sequence[Any], variables: Sequence[Any], shard: Shard,
                             options: ReductionOptions, local: set[int] | frozenset[int] = frozenset()
                             ) -> tuple[list, list]:
    """Each worker's reduced gradients for the variables it owns (None for the others), and the collectives'
    results that this worker does not use.

    Local variables' gradients stay, scaled as in `allreduce.reduce_gradients`; sparse gradients are
    allgathered (unless `sparse_as_dense`) and kept by their owner. The unused results must be made to run
    (a control dependency): in a traced step TensorFlow prunes an op whose result nothing uses, and the
    other workers would wait for this one's part of that collective forever.
    """
    out: list = [None] * len(grads)
    unused: list = []
    dense = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        var = variables[i]
        if var_id(var) in local:
            out[i] = scale_local(g, options) if options.scale_local_gradients else g
        elif isinstance(g, tf.IndexedSlices) and not options.sparse_as_dense:
            reduced = allgather_sparse(g, options, name=f"hvdkeras.gradients.sparse.{i}")
            if shard.owns(var):
                out[i] = _sparse_rows(reduced, shard.piece(shard.index(var)), var)
            else:  # both of its allgathers: a worker that owns none of the variable would prune the indices'
                unused += [reduced.values, reduced.indices]
        else:
            out[i] = tf.convert_to_tensor(g)
            dense.append(i)
    buckets = balanced_groups(dense_groups(dense, variables, options), variables, shard.pieces_of, shard.size)
    for k, group in enumerate(buckets):
        unused += _reduce_scatter_group(out, group, variables, shard, options, name=f"hvdkeras.gradients.{k}")
    return out, unused


def _sparse_rows(reduced: tf.IndexedSlices, piece: Any, var: Any) -> tf.IndexedSlices:
    """The rows of a sparse gradient within this worker's piece of `var`, indexed from the piece's first row."""
    if covers(var, piece):
        return reduced
    keep = tf.logical_and(reduced.indices >= piece.lo, reduced.indices < piece.hi)
    indices = tf.boolean_mask(reduced.indices, keep) - tf.cast(piece.lo, reduced.indices.dtype)
    return tf.IndexedSlices(tf.boolean_mask(reduced.values, keep), indices,
                            dense_shape=tf.constant([piece.hi - piece.lo] + list(var.shape[1:]), tf.int64))


def _piece_shape(var: Any, piece: Any) -> list[int]:
    return [piece.hi - piece.lo] + [int(d) for d in var.shape[1:]] if len(var.shape) else []


def _reduce_scatter_group(out: list, group: list[int], variables: Sequence[Any], shard: Shard,
                          options: ReductionOptions, name: str) -> list:
    per, lengths = parts(group, variables, shard.pieces_of, shard.size)
    longest, total = max(lengths), sum(lengths)
    if shard.size * longest > 2 * total:
        # One variable owned whole dominates the group: padding every part to it would send more than an allreduce.
        reduced = list(out)
        allreduce_group(reduced, group, options, name=name)
        for i in group:
            out[i] = None
        for i, p in per[shard.rank]:
            out[i] = piece_rows(reduced[i], variables[i], p)
        return [] if per[shard.rank] else [reduced[group[0]]]
    compressed, ctxs = {}, {}
    for i in group:
        compressed[i], ctxs[i] = options.compression.compress(out[i])
    dtype = compressed[group[0]].dtype
    segments = []
    for owned, length in zip(per, lengths):
        flat = pack([piece_rows(compressed[i], variables[i], p) for i, p in owned], dtype)
        segments.append(tf.pad(flat, [[0, longest - length]]) if length < longest else flat)
    # A reduce-scatter as an alltoall (each worker receives every worker's copy of its own part) and a sum
    # here, in rank order: Horovod's Gloo reduce-scatter took twice an allreduce of the same buffer, the
    # alltoall and the sum about half of one (docs/sharding.md). Average and the predivide
    # factor scale as Horovod's allreduce does: before the sum, then after it.
    pre, post = 1.0, 1.0
    if options.op == C.Average:
        pre, post = 1.0 / options.gradient_predivide_factor, options.gradient_predivide_factor / shard.size
    sent = tf.concat(segments, axis=0)
    if pre != 1.0:
        sent = sent * tf.cast(pre, dtype)
    with tf.device(options.device_dense):
        received = C.alltoall(sent, name=name, process_set=options.process_set)
    mine = tf.reduce_sum(tf.reshape(received, [shard.size, longest]), axis=0)
    if post != 1.0:
        mine = mine * tf.cast(post, dtype)
    for i in group:
        out[i] = None
    offset = 0
    for i, p in per[shard.rank]:
        n = (p.hi - p.lo) * row_elements(variables[i])
        part = tf.reshape(mine[offset:offset + n], _piece_shape(variables[i], p))
        out[i] = options.compression.decompress(part, ctxs[i])
        offset += n
    return [] if per[shard.rank] else [mine]


# -------------------------------------------------------------------------------------------------- weights
# Above this many bytes of weights of one dtype, they are all-gathered in the reduce-scatter's groups, not in one
# buffer: one allgather of a whole large model raised the peak memory per worker (8 x Dense(3584), Adam, N = 2:
# 3.00 GiB against 2.55 GiB in its groups), which sharding exists to lower. 64 MiB is Horovod's fusion buffer.
GATHER_BYTES = 64 << 20


def all_gather_variables(variables: Sequence[Any], shard: Shard, options: ReductionOptions,
                         after: Sequence[Any] = ()) -> None:
    """Sets every worker's copy of `variables` (shared ones, updated in pieces by their owners) to the owners'
    values: each owner sends its pieces (its slice variables, or the model's variable it owns whole).

    `after`: tensors each allgather depends on (an empty slice of each is sent with it). In a traced step a
    control dependency is not enough: TensorFlow runs an allgather whose input is a constant at once.
    """
    by_dtype: dict[Any, list[int]] = {}
    for i, v in enumerate(variables):
        if not shard.is_local(v):
            by_dtype.setdefault(v.dtype, []).append(i)
    anchors = [tf.reshape(t, [-1])[:0] for t in after]
    # One allgather per dtype, not one per bucket: the next forward pass needs every weight, so nothing waits on
    # a bucket's share alone, and each collective costs a round of Horovod's coordination. Padding one buffer
    # to its longest part sends no more than padding each bucket's to its own. A large model: GATHER_BYTES.
    groups = []
    for same in by_dtype.values():
        if sum(nbytes(variables[i]) for i in same) <= GATHER_BYTES:
            groups.append(same)
        else:
            groups += balanced_groups(dense_groups(same, variables, options), variables, shard.pieces_of, shard.size)
    for k, group in enumerate(groups):
        per, lengths = parts(group, variables, shard.pieces_of, shard.size)
        dtype = variables[group[0]].dtype
        # Every worker sends the same number of elements, its part padded to the longest. With parts of
        # different lengths, Horovod 0.28.1 over Gloo returned one bucket's buffer for another's (measured: two
        # buckets in one step, one worker sending nothing to either and the other 64 and 32768 elements).
        longest = max(lengths)
        sources = [tf.convert_to_tensor(shard.slices[shard.index(variables[i])]) for i, _ in per[shard.rank]]
        flat = pack(sources + [tf.cast(a, dtype) for a in anchors], dtype)
        if lengths[shard.rank] < longest:
            flat = tf.pad(flat, [[0, longest - lengths[shard.rank]]])
        with tf.device(options.device_dense):
            full = C.allgather(flat, name=f"hvdkeras.weights.{k}", process_set=options.process_set)
        # Every worker assigns every variable of the buffer from the gathered one, its own too (the same bits): a
        # traced step would otherwise prune the allgather on a worker that owns all of the buffer's variables.
        found: dict[int, list] = {i: [] for i in group}
        for r, owned in enumerate(per):
            offset = r * longest
            for i, p in owned:
                n = (p.hi - p.lo) * row_elements(variables[i])
                found[i].append((p.lo, full[offset:offset + n]))
                offset += n
        for i in group:
            flat_value = tf.concat([t for _, t in sorted(found[i], key=lambda x: x[0])], axis=0)
            variables[i].assign(tf.reshape(flat_value, variables[i].shape))


def _rank_and_size() -> tuple[int, int]:
    return (C.rank(), C.size()) if C.is_initialized() else (0, 1)


class ReduceScatterReducer(Reducer):
    """Each worker reduces, updates and then shares its own part of the variables (see the module's doc).

    Args:
        options: how to reduce (a ReductionOptions; the buckets are the allreduce reducer's).
        local: a function returning the `var_id`s of the variables every worker keeps its own of.
        rank_and_size: this worker's rank and the job's size, when built (default: Horovod's).
    """

    updates_after_apply = True

    def __repr__(self) -> str:
        return "ReduceScatterReducer()"

    def __init__(self, options: ReductionOptions, local: Callable[[], Any] = frozenset,
                 rank_and_size: Callable[[], tuple[int, int]] = _rank_and_size):
        self.options = options
        self._local = local
        self._rank_and_size = rank_and_size
        self.shard: Shard | None = None
        # Whether the optimizer's math may update a variable in pieces (set by the optimizer's state before
        # `build`); None: every variable is owned whole.
        self.splittable: Callable[[Any], bool] | None = None
        self.optimizer_state = ShardedState(self)

    def build(self, variables: Sequence[Any]) -> None:
        """Partitions the variables over the workers there are now (again after an elastic resize)."""
        rank, size = self._rank_and_size()
        self.shard = Shard.make(variables, self.options, self._local() or frozenset(), rank, size,
                                splittable=self.splittable)

    def updated(self, variables: Sequence[Any]) -> list:
        """This worker's variables to update: the ones it owns whole, and slice variables of its pieces."""
        return [self.shard.slices[self.shard.index(v)] for v in variables if self.shard.owns(v)]

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any], name: str = "hvdkeras.gradients") -> Reduced:
        variables = list(variables)
        if self.shard.size == 1:  # one worker owns everything: nothing to scatter
            return Reduced(reduce_gradients(grads, variables, self.options, self._local() or frozenset(), name=name),
                           variables)
        grads = list(grads)
        reduced, unused = reduce_scatter_gradients(grads, variables, self.shard, self.options,
                                                   self._local() or frozenset())
        self.shard.refresh()
        owned = [(g, self.shard.slices[self.shard.index(v)]) for g, v in zip(reduced, variables) if self.shard.owns(v)]
        # Empty slices of the received gradients and of the collectives' unused results ride along in the
        # allgathers: a data dependency that makes each allgather wait for this worker's gradients (one whose
        # part of a bucket is empty would otherwise be sent at the start of the step, and wait there holding
        # the other workers), and keeps the unused results from being pruned.
        received = [g.values if isinstance(g, tf.IndexedSlices) else g for g, _ in owned if g is not None]
        pending = ([v for g, v in zip(grads, variables) if g is not None], unused + received[:1])
        return Reduced([g for g, _ in owned], [v for _, v in owned], pending)

    def after_apply(self, reduced: Reduced) -> None:
        if reduced.pending is None:
            return
        stepped, after = reduced.pending
        self.share_updated(stepped, after=after)

    def share_updated(self, variables: Sequence[Any], after: Sequence[Any] = ()) -> None:
        """Every worker's copy of `variables` set to its owner's (`all_gather_variables`). Collective."""
        all_gather_variables(variables, self.shard, self.options, after=after)
