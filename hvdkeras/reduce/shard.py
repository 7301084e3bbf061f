"""Who owns which part of the variables under the reduce-scatter reducer (ZeRO): the partition into pieces (rows
of a variable's first axis), and the packing of a worker's parts into one buffer.

A variable the optimizer's math may update in parts (`splittable`: an elementwise rule such as Adam's) is cut
into contiguous runs of rows, one per worker, so each worker owns about 1/N of the state however unequal the
variables are (where whole variables would not already do that). A variable the math needs whole
(Adafactor's factored moments, clipnorm's per-variable norm, a per-variable exclusion) is owned whole by one
worker. The owner of a piece updates a variable of the piece's shape (`Shard.slices`: the model's variable
itself for a whole one), and the updated pieces are all-gathered.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import keras
import tensorflow as tf

from hvdkeras.reduce.groups import dense_groups, numel, rows
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.variables import var_id

EVERY = -1  # the owner of a local variable (PartialDistributedOptimizer): every worker keeps its own
# Every cut falls on a multiple of this many elements of its variable. The CPU kernels run an elementwise op
# over whole SIMD packets and then the last few elements one at a time, and in a traced step some packet ops
# are not the one-at-a-time ops' bits (TensorFlow's graph optimizer makes RMSprop's division by a square root a
# multiplication by a reciprocal square root, approximated per packet): a piece that begins and ends on a
# packet boundary is computed exactly as those elements of the whole variable are. An unaligned cut changed
# RMSprop's weights by 6e-8 in 20 steps; 64 elements is a whole number of packets up to 2048-bit SIMD.
ALIGN = 64
# Variables are cut only where owning them whole would leave a worker more than 1/N + this of the state.
WHOLE_SLACK = 0.01


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows [lo, hi) of a variable's first axis (all of a scalar: 0, 1) and the worker that owns them."""

    owner: int
    lo: int
    hi: int


def _levels(load: Sequence[float], amount: float) -> list[float]:
    """How much of `amount` each worker takes so that the least loaded are filled to one level (water-filling)."""
    order = sorted(range(len(load)), key=lambda r: (load[r], r))
    level, filled = 0.0, 0.0
    for k, r in enumerate(order):
        filled += load[r]
        level = (amount + filled) / (k + 1)
        if k + 1 == len(order) or level <= load[order[k + 1]]:
            break
    return [max(0.0, level - x) for x in load]


def partition(sizes: Sequence[int], row_counts: Sequence[int], splittable: Sequence[bool],
              buckets: Sequence[Sequence[int]], n: int) -> list[tuple[Piece, ...]]:
    """The pieces of each variable, in row order.

    Whole variables where that leaves no worker more than 1/N + WHOLE_SLACK of the elements (equal layers, say),
    or where cutting would not leave the most loaded worker less: no worker then needs a copy of part of a
    variable. Otherwise, bucket by bucket, the variables that must stay whole go first, largest first, to the
    worker with the least of that bucket so far (then the least overall, then the lowest rank); the splittable
    ones, in the bucket's order, then fill the workers' totals so far up to one level, each worker taking one
    contiguous run of their rows (cut at the nearest row that begins a multiple of ALIGN elements; a variable
    too small for such a cut stays whole).
    So the workers' totals are about equal, and so are each large bucket's reduce-scatter parts. Depends only on
    the sizes, rows, rule and buckets, so every worker computes the same pieces. Variables in no bucket are
    EVERY's (local).
    """
    whole = _partition(sizes, row_counts, [False] * len(sizes), buckets, n)
    most = _most_held(sizes, row_counts, whole, n)
    if not any(splittable) or most <= sum(sizes) * (1 / n + WHOLE_SLACK):
        return whole
    cut = _partition(sizes, row_counts, splittable, buckets, n)
    return cut if _most_held(sizes, row_counts, cut, n) < most else whole


def _most_held(sizes: Sequence[int], row_counts: Sequence[int], pieces: Sequence[Sequence[Piece]], n: int) -> int:
    return max(_held(sizes, row_counts, pieces, n))


def _held(sizes: Sequence[int], row_counts: Sequence[int], pieces: Sequence[Sequence[Piece]], n: int) -> list[int]:
    """How many elements of the shared variables each of the n workers owns."""
    held = [0] * n
    for size, count, own in zip(sizes, row_counts, pieces):
        for p in own:
            if p.owner != EVERY:
                held[p.owner] += size if (p.lo, p.hi) == (0, count) else (p.hi - p.lo) * (size // count)
    return held


def _partition(sizes: Sequence[int], row_counts: Sequence[int], splittable: Sequence[bool],
               buckets: Sequence[Sequence[int]], n: int) -> list[tuple[Piece, ...]]:
    pieces: list[tuple[Piece, ...]] = [(Piece(EVERY, 0, r),) for r in row_counts]
    total = [0.0] * n
    for bucket in buckets:
        load = [0.0] * n
        whole = [i for i in bucket if not splittable[i] or row_counts[i] < 2]
        split = [i for i in bucket if splittable[i] and row_counts[i] >= 2]
        for i in sorted(whole, key=lambda i: (-sizes[i], i)):
            r = min(range(n), key=lambda r: (load[r], total[r], r))
            pieces[i] = (Piece(r, 0, row_counts[i]),)
            load[r] += sizes[i]
            total[r] += sizes[i]
        takes = _levels(total, float(sum(sizes[i] for i in split)))
        ends = [sum(takes[:r + 1]) for r in range(n)]
        start = 0.0
        for i in split:
            per_row = sizes[i] / row_counts[i]
            unit = ALIGN // math.gcd(sizes[i] // row_counts[i], ALIGN)  # rows per cut that keeps the alignment
            lo, own = 0, []
            for r in range(n):
                cut = round((ends[r] - start) / per_row / unit) * unit
                hi = row_counts[i] if r == n - 1 else min(row_counts[i], max(lo, cut))
                if hi > lo:
                    own.append(Piece(r, lo, hi))
                    load[r] += (hi - lo) * per_row
                    total[r] += (hi - lo) * per_row
                lo = hi
            pieces[i] = tuple(own)
            start += sizes[i]
    return pieces


def covers(var: Any, piece: Piece) -> bool:
    """Whether `piece` is all of `var`."""
    return piece.lo == 0 and piece.hi == rows(var)


def piece_rows(value: Any, var: Any, piece: Piece) -> Any:
    """`piece`'s rows of `value` (a tensor or array shaped like `var` along its first axis, as a gradient or an
    elementwise optimizer's slot is); `value` itself for a piece that is all of `var`."""
    return value if covers(var, piece) else value[piece.lo:piece.hi]


@dataclasses.dataclass(frozen=True)
class Shard:
    """Who owns which piece of the variables an optimizer was built on (in that order), and the variables this
    worker updates: `slices[i]` is the model's variable where this worker owns it whole, a variable of its
    piece's shape where it owns part of it, None where it owns none of it."""

    variables: tuple
    pieces: tuple
    rank: int
    size: int
    slices: tuple

    @classmethod
    def make(cls, variables: Sequence[Any], options: ReductionOptions, local: set[int] | frozenset[int],
             rank: int, size: int, splittable: Callable[[Any], bool] | None = None) -> "Shard":
        """The pieces over `size` workers. `splittable(variable)`: whether the optimizer's math may update it in
        parts (default: no variable is cut, each is owned whole). Makes this worker's slice variables: call it
        outside a traced function (tf.init_scope)."""
        variables = tuple(variables)
        shared = [i for i, v in enumerate(variables) if var_id(v) not in local]
        buckets = dense_groups(shared, variables, options)
        rule = [bool(splittable(v)) if splittable is not None else False for v in variables]
        pieces = partition([numel(v) for v in variables], [rows(v) for v in variables], rule, buckets, size)
        idle = sorted(set(range(size)) - {p.owner for own in pieces for p in own})
        if shared and idle:
            raise ValueError(
                "shard_optimizer_state=True needs at least one trainable variable (or part of one) per worker to "
                f"own: {len(shared)} shared variables for {size} workers leave workers {idle} without any. "
                "Use fewer workers or shard_optimizer_state=False.")
        slices = []
        for var, own in zip(variables, pieces):
            mine = [p for p in own if p.owner in (EVERY, rank)]
            if not mine:
                slices.append(None)
            elif covers(var, mine[0]):
                slices.append(var)
            else:
                p = mine[0]
                slices.append(keras.Variable(tf.convert_to_tensor(var)[p.lo:p.hi], dtype=var.dtype,
                                             trainable=var.trainable, name=var.name))
        return cls(variables, tuple(pieces), rank, size, tuple(slices))

    def index(self, var: Any) -> int:
        return self._indices()[var_id(var)]

    def _indices(self) -> dict[int, int]:
        cached = self.__dict__.get("_index_cache")
        if cached is None:
            cached = {var_id(v): i for i, v in enumerate(self.variables)}
            object.__setattr__(self, "_index_cache", cached)
        return cached

    def pieces_of(self, var: Any) -> tuple[Piece, ...]:
        return self.pieces[self.index(var)]

    def is_local(self, var: Any) -> bool:
        return self.pieces_of(var)[0].owner == EVERY

    def has_local(self) -> bool:
        return any(own[0].owner == EVERY for own in self.pieces)

    def piece(self, i: int) -> Piece | None:
        """This worker's piece of the i-th variable (its whole for a local one), or None."""
        return next((p for p in self.pieces[i] if p.owner in (EVERY, self.rank)), None)

    def holds(self, i: int) -> bool:
        """Whether this worker owns a piece of the i-th variable (a shared one: not local)."""
        return any(p.owner == self.rank for p in self.pieces[i])

    def owns(self, var: Any) -> bool:
        """Whether this worker updates any of `var` (a piece, the whole, or its own copy of a local one)."""
        return self.slices[self.index(var)] is not None

    def split(self, i: int) -> bool:
        """Whether the i-th variable is cut into pieces of more than one worker."""
        return len(self.pieces[i]) > 1

    def owned(self) -> list:
        """The variables this worker's optimizer updates, in the built order: its whole variables (the model's own)
        and slice variables of its pieces."""
        return [s for s in self.slices if s is not None]

    def owned_indices(self) -> list[int]:
        return [i for i, s in enumerate(self.slices) if s is not None]

    def part(self, i: int, value: Any) -> Any:
        """This worker's rows of `value` (a tensor or array shaped like the i-th variable, or like its slot)."""
        p = self.piece(i)
        return value if p is None else piece_rows(value, self.variables[i], p)

    def refresh(self) -> None:
        """Sets each slice variable to its rows of the model's variable (which every worker holds in full, and which
        may have been set since: a broadcast, set_weights, a load). Ops, in order before the update that reads them."""
        for i, s in enumerate(self.slices):
            if s is not None and s is not self.variables[i]:
                s.assign(self.part(i, tf.convert_to_tensor(self.variables[i])))

    def elements_by_worker(self) -> list[int]:
        """How many elements of the shared variables each worker owns (what its slots are made from)."""
        return _held([numel(v) for v in self.variables], [rows(v) for v in self.variables], self.pieces, self.size)


def pack(tensors: Sequence[Any], dtype: Any) -> tf.Tensor:
    """The tensors flattened into one 1-D tensor of `dtype`, in order (empty for none)."""
    if not tensors:
        return tf.zeros([0], dtype=dtype)
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)
