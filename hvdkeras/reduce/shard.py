"""Who owns which variable under the reduce-scatter reducer (ZeRO): the partition by whole variables, and the
packing of a worker's part into one buffer."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import tensorflow as tf

from hvdkeras.reduce.groups import dense_groups, numel
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.variables import var_id

EVERY = -1  # the owner of a local variable (PartialDistributedOptimizer): every worker keeps its own


def partition(sizes: Sequence[int], buckets: Sequence[Sequence[int]], n: int) -> list[int]:
    """The owner of each variable: within each bucket, largest first, to the worker with the least of that
    bucket so far, then the least overall, then the lowest rank.

    So each bucket's reduce-scatter segments are about equal (little padding) and the workers' totals too.
    Depends only on the sizes and buckets, so every worker computes the same owners. Indices in no bucket
    get EVERY.
    """
    owners = [EVERY] * len(sizes)
    total = [0] * n
    for bucket in buckets:
        load = [0] * n
        for i in sorted(bucket, key=lambda i: (-sizes[i], i)):
            r = min(range(n), key=lambda r: (load[r], total[r], r))
            owners[i] = r
            load[r] += sizes[i]
            total[r] += sizes[i]
    return owners


@dataclasses.dataclass(frozen=True)
class Shard:
    """Who owns which variable, for the variables an optimizer was built on (in that order)."""

    variables: tuple
    owners: tuple
    rank: int
    size: int

    @classmethod
    def make(cls, variables: Sequence[Any], options: ReductionOptions, local: set[int] | frozenset[int],
             rank: int, size: int) -> "Shard":
        variables = tuple(variables)
        shared = [i for i, v in enumerate(variables) if var_id(v) not in local]
        buckets = dense_groups(shared, variables, options)
        owners = partition([numel(v) for v in variables], buckets, size)
        idle = sorted(set(range(size)) - set(owners))
        if shared and idle:
            raise ValueError(
                "shard_optimizer_state=True needs at least one trainable variable per worker to own: "
                f"{len(shared)} shared variables for {size} workers leave workers {idle} without any. "
                "Use fewer workers or shard_optimizer_state=False.")
        return cls(variables, tuple(owners), rank, size)

    def owner(self, var: Any) -> int:
        return self.owners[self.index(var)]

    def index(self, var: Any) -> int:
        return self._indices()[var_id(var)]

    def _indices(self) -> dict[int, int]:
        cached = self.__dict__.get("_index_cache")
        if cached is None:
            cached = {var_id(v): i for i, v in enumerate(self.variables)}
            object.__setattr__(self, "_index_cache", cached)
        return cached

    def owns(self, var: Any) -> bool:
        return self.owner(var) in (EVERY, self.rank)

    def owned(self) -> list:
        """This worker's variables (its own share and the local ones), in the built order."""
        return [v for v, o in zip(self.variables, self.owners) if o in (EVERY, self.rank)]

    def elements_by_worker(self) -> list[int]:
        """How many elements of the shared variables each worker owns (what its slots are made from)."""
        counts = [0] * self.size
        for v, o in zip(self.variables, self.owners):
            if o != EVERY:
                counts[o] += numel(v)
        return counts


def pack(tensors: Sequence[Any], dtype: Any) -> tf.Tensor:
    """The tensors flattened into one 1-D tensor of `dtype`, in order (empty for none)."""
    if not tensors:
        return tf.zeros([0], dtype=dtype)
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)
