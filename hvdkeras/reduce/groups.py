"""Bucketing and groups, for every reducer: which gradients travel together in one collective.

- `gradient_buckets`: the dense gradients in buckets of about `bucket_bytes`, in the order the backward pass
  produces them (the default grouping: each bucket's collective starts while the backward pass still runs);
- `even_groups` (`groups=n`) and `listed_groups` (`groups=[[v, ...], ...]`);
- `dense_groups`: the options' grouping, split by dtype (one fused collective per dtype);
- `parts` and `balanced_groups`: a group's elements by the worker that owns each piece, and consecutive
  groups merged until the owners' parts are about equal (the reduce-scatter's padding stays small).

Each depends only on the variables' order, shapes and dtypes (and the owners), so it is the same on every worker.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.variables import var_id


def numel(var: Any) -> int:
    """How many elements a variable (or tensor) of a fully defined shape holds."""
    return rows(var) * row_elements(var)


def rows(var: Any) -> int:
    """How many rows a variable has along its first axis (1 for a scalar): the unit it is cut into pieces by."""
    return int(var.shape[0]) if len(var.shape) else 1


def row_elements(var: Any) -> int:
    """How many elements one row of a variable holds."""
    count = 1
    for dim in var.shape[1:]:
        count *= int(dim)
    return count


def nbytes(var: Any) -> int:
    """The bytes of a variable's (or tensor's) gradient; 0 for a shape not fully defined."""
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
        filled += nbytes(variables[i])
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


def parts(group: Sequence[int], variables: Sequence[Any], pieces: Callable[[Any], Sequence[Any]], size: int
          ) -> tuple[list[list[tuple[int, Any]]], list[int]]:
    """The group's pieces by owner (`pieces(variable)`: its pieces, each with an `owner` in [0, size) and rows
    [`lo`, `hi`)), as (index, piece) in the group's order, and how many elements each owner's part holds."""
    per: list[list[tuple[int, Any]]] = [[] for _ in range(size)]
    lengths = [0] * size
    for i in group:
        for p in pieces(variables[i]):
            per[p.owner].append((i, p))
            lengths[p.owner] += (p.hi - p.lo) * row_elements(variables[i])
    return per, lengths


def balanced_groups(groups: Sequence[Sequence[int]], variables: Sequence[Any],
                    pieces: Callable[[Any], Sequence[Any]], size: int, slack: float = 1.25) -> list[list[int]]:
    """Consecutive groups (buckets) of one dtype merged until each merged group's parts are about equal
    (the longest part times the number of workers within `slack` of the group's size), so that padding the
    parts to equal length costs little. A bucket of one large variable owned whole is otherwise all one
    worker's."""
    out: list[list[int]] = []
    current: list[int] = []
    for group in groups:
        if current and variables[current[0]].dtype != variables[group[0]].dtype:
            out.append(current)
            current = []
        current = current + list(group)
        _, lengths = parts(current, variables, pieces, size)
        if size * max(lengths) <= slack * sum(lengths):
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out
