"""Optimizer state sharded across workers (ZeRO stages 1 and 2): DistributedOptimizer(shard_optimizer_state=True).

The partition is by whole variables. Each trainable variable is owned by one worker, and the inner optimizer
is built on its owner only, so each slot (a moment, a velocity, Adafactor's factored second moments) exists
once in the job instead of once per worker. Every step:

1. The dense gradients are reduce-scattered in the buckets the unsharded optimizer all-reduces them in
   (consecutive buckets merged until the workers' parts are about equal), each as soon as the backward pass
   has produced it: a group's gradients are packed by owner into one buffer of N equal parts (each padded
   to the longest), an alltoall sends each worker every copy of its part, and it sums them. A group whose
   padding would make it send more than an allreduce of it is all-reduced instead, and each worker keeps
   its own part.
2. Each worker's inner optimizer updates the variables it owns, in place.
3. The updated variables are all-gathered into every worker's weights, one allgather per bucket, before the
   next forward pass.

Whole variables keep every per-variable rule of Keras's optimizers exact and unmodified (clipnorm,
Adafactor's factored moments, Lamb's trust ratio, exclude_from_weight_decay, EMA), and the owner updates the
model's own variable, with no second copy of the weights. The rules that span variables are made to span
workers: global_clipnorm's norm and the loss-scale optimizer's finiteness check are all-reduced.

Checkpoints hold the full state, in the order an unsharded optimizer of the same kind saves it, so plain
Keras loads them; `StateLayout` maps that order onto each worker's part.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf
from keras.optimizers import LossScaleOptimizer

from hvdkeras import _collectives as C
from hvdkeras import reduction
from hvdkeras.reduction import ReductionOptions, numel
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
        buckets = reduction.dense_groups(shared, variables, options)
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


# ------------------------------------------------------------------------------------------------ gradients
def reduce_scatter_gradients(grads: Sequence[Any], variables: Sequence[Any], shard: Shard,
                             options: ReductionOptions, local: set[int] | frozenset[int] = frozenset()
                             ) -> tuple[list, list]:
    """Each worker's reduced gradients for the variables it owns (None for the others), and the collectives'
    results that this worker does not use.

    Local variables' gradients stay, scaled as in `reduction.reduce_gradients`; sparse gradients are
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
            out[i] = reduction._scale_local(g, options) if options.scale_local_gradients else g
        elif isinstance(g, tf.IndexedSlices) and not options.sparse_as_dense:
            reduced = reduction._reduce_sparse(g, options, name=f"hvdkeras.gradients.sparse.{i}")
            if shard.owns(var):
                out[i] = reduced
            else:
                unused.append(reduced.values)
        else:
            out[i] = tf.convert_to_tensor(g)
            dense.append(i)
    for k, group in enumerate(balanced_groups(reduction.dense_groups(dense, variables, options), variables, shard)):
        unused += _reduce_scatter_group(out, group, variables, shard, options, name=f"hvdkeras.gradients.{k}")
    return out, unused


def _parts(group: Sequence[int], variables: Sequence[Any], shard: Shard) -> tuple[list[list[int]], list[int]]:
    """The group's indices by owner, and how many elements each owner's part holds."""
    per: list[list[int]] = [[] for _ in range(shard.size)]
    for i in group:
        per[shard.owner(variables[i])].append(i)
    return per, [sum(numel(variables[i]) for i in owned) for owned in per]


def _flat(tensors: Sequence[Any], dtype: Any) -> tf.Tensor:
    if not tensors:
        return tf.zeros([0], dtype=dtype)
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def balanced_groups(groups: Sequence[Sequence[int]], variables: Sequence[Any], shard: Shard,
                    slack: float = 1.25) -> list[list[int]]:
    """Consecutive groups (buckets) of one dtype merged until each merged group's parts are about equal
    (the longest part times the number of workers within `slack` of the group's size), so that padding the
    parts to equal length costs little. A bucket of one large variable is otherwise all one worker's."""
    out: list[list[int]] = []
    current: list[int] = []
    for group in groups:
        if current and variables[current[0]].dtype != variables[group[0]].dtype:
            out.append(current)
            current = []
        current = current + list(group)
        _, lengths = _parts(current, variables, shard)
        if shard.size * max(lengths) <= slack * sum(lengths):
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def _reduce_scatter_group(out: list, group: list[int], variables: Sequence[Any], shard: Shard,
                          options: ReductionOptions, name: str) -> list:
    per, lengths = _parts(group, variables, shard)
    longest, total = max(lengths), sum(lengths)
    if shard.size * longest > 2 * total:
        # One variable dominates the group: padding every part to it would send more than an allreduce.
        reduced = list(out)
        reduction._reduce_dense(reduced, group, options, name=name)
        for i in group:
            out[i] = reduced[i] if i in per[shard.rank] else None
        return [] if per[shard.rank] else [reduced[group[0]]]
    compressed, ctxs = {}, {}
    for i in group:
        compressed[i], ctxs[i] = options.compression.compress(out[i])
    dtype = compressed[group[0]].dtype
    segments = []
    for owned, length in zip(per, lengths):
        flat = _flat([compressed[i] for i in owned], dtype)
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
    for i in per[shard.rank]:
        n = numel(variables[i])
        part = tf.reshape(mine[offset:offset + n], variables[i].shape)
        out[i] = options.compression.decompress(part, ctxs[i])
        offset += n
    return [] if per[shard.rank] else [mine]


# -------------------------------------------------------------------------------------------------- weights
def all_gather_variables(variables: Sequence[Any], shard: Shard, options: ReductionOptions,
                         after: Sequence[Any] = ()) -> None:
    """Sets every worker's copy of `variables` (shared ones, updated by their owners) to the owner's value.

    `after`: tensors each allgather depends on (an empty slice of each is sent with it). In a traced step a
    control dependency is not enough: TensorFlow runs an allgather whose input is a constant at once.
    """
    shared = [i for i, v in enumerate(variables) if shard.owner(v) != EVERY]
    anchors = [tf.reshape(t, [-1])[:0] for t in after]
    for k, group in enumerate(balanced_groups(reduction.dense_groups(shared, variables, options), variables, shard)):
        per, lengths = _parts(group, variables, shard)
        dtype = variables[group[0]].dtype
        # Every worker sends the same number of elements, its part padded to the longest. With parts of
        # different lengths, Horovod 0.28.1 over Gloo returned one bucket's buffer for another's (measured: two
        # buckets in one step, one worker sending nothing to either and the other 64 and 32768 elements).
        longest = max(lengths)
        flat = _flat([tf.convert_to_tensor(variables[i]) for i in per[shard.rank]]
                     + [tf.cast(a, dtype) for a in anchors], dtype)
        if lengths[shard.rank] < longest:
            flat = tf.pad(flat, [[0, longest - lengths[shard.rank]]])
        with tf.device(options.device_dense):
            full = C.allgather(flat, name=f"hvdkeras.weights.{k}", process_set=options.process_set)
        # Every worker assigns every variable of the bucket from the gathered buffer, its own too (the same
        # bits): a traced step would otherwise prune the allgather on a worker that owns the whole bucket.
        for r, owned in enumerate(per):
            offset = r * longest
            for i in owned:
                n = numel(variables[i])
                variables[i].assign(tf.reshape(full[offset:offset + n], variables[i].shape))
                offset += n


# -------------------------------------------------------------------------------------- cross-worker rules
def slots(optimizer: Any) -> list:
    """An optimizer's variables but those it holds once (iterations, learning rate, loss scale): its slots."""
    once = {id(v) for layer in _layers(optimizer) for v in vars(layer).values() if isinstance(v, keras.Variable)}
    return [v for v in optimizer.variables if id(v) not in once]


def _layers(optimizer: Any) -> list:
    layers = [optimizer]
    while isinstance(layers[-1], LossScaleOptimizer):
        layers.append(layers[-1].inner_optimizer)
    return layers


def _all_finite(layer: Any, process_set: Any):
    own = type(layer).check_finite

    def check_finite(self, grads):
        bad = tf.cast(tf.logical_not(own(self, grads)), tf.int32)
        return tf.equal(C.allreduce(bad, op=C.Sum, name="hvdkeras.sharded.finite", process_set=process_set), 0)

    return types.MethodType(check_finite, layer)


def _global_clip(layer: Any, process_set: Any):
    own = type(layer)._clip_gradients

    def clip_gradients(self, grads):
        # Keras's clip_by_global_norm, with the squared norm summed over every worker's gradients.
        if self.clipnorm or not self.global_clipnorm:
            return own(self, grads)
        present = [g for g in grads if g is not None]
        local = tf.add_n([tf.reduce_sum(tf.square(g)) for g in present]) if present else tf.constant(0.0)
        use_norm = tf.sqrt(C.allreduce(local, op=C.Sum, name="hvdkeras.sharded.global_norm", process_set=process_set))
        clip = self.global_clipnorm
        scale = clip * tf.minimum(1.0 / use_norm, 1.0 / clip) + (use_norm - use_norm)
        return [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]

    return types.MethodType(clip_gradients, layer)


def install_cross_worker_rules(optimizer: Any, shard: Shard, options: ReductionOptions) -> None:
    """Makes the rules that span all variables span all workers, on this optimizer instance only:
    global_clipnorm's norm over every worker's gradients, and the loss-scale finiteness check (every worker
    skips a step where any worker's gradients overflow)."""
    for layer in _layers(optimizer):
        if isinstance(layer, LossScaleOptimizer):
            layer.check_finite = _all_finite(layer, options.process_set)
        elif layer.global_clipnorm:
            if any(o == EVERY for o in shard.owners):
                raise ValueError(
                    "shard_optimizer_state=True cannot combine `global_clipnorm` with local variables "
                    "(PartialDistributedOptimizer, register_local_var): the norm would count each worker's local "
                    f"gradients once per worker. Received: global_clipnorm={layer.global_clipnorm}")
            layer._clip_gradients = _global_clip(layer, options.process_set)


# ---------------------------------------------------------------------------------------------- the state
_NOT_SLOTS = ("_variables", "_trainable_variables")


def _addresses(optimizer: Any, count: int) -> dict[int, tuple]:
    """id(variable) -> where an optimizer keeps it: (attribute,) for one variable, (attribute, i) for the
    i-th entry of a list with one entry per trainable variable; through `inner_optimizer` for a loss-scale
    optimizer."""
    found: dict[int, tuple] = {}

    def walk(obj: Any, prefix: tuple) -> None:
        for name, value in vars(obj).items():
            if name in _NOT_SLOTS:
                continue
            if isinstance(value, keras.Variable):
                found.setdefault(id(value), prefix + (name,))
            elif isinstance(value, (list, tuple)) and len(value) == count:
                for i, item in enumerate(value):
                    if isinstance(item, keras.Variable):
                        found.setdefault(id(item), prefix + (name, i))
            elif name == "inner_optimizer" and isinstance(value, keras.optimizers.Optimizer):
                walk(value, prefix + (name,))

    walk(optimizer, ())
    return found


def _resolve(optimizer: Any, address: tuple, index: int | None = None) -> Any:
    obj = optimizer
    for part in address[:-1] if index is not None else address:
        obj = getattr(obj, part) if isinstance(part, str) else obj[part]
    return obj[index] if index is not None else obj


def _cheap_add_variable(self, shape, initializer="zeros", dtype=None, aggregation="none", layout=None, name=None):
    del shape, initializer, layout  # a stand-in: only its place in the order matters
    variable = keras.Variable(0, dtype=dtype, trainable=False, aggregation=aggregation, name=name)
    self._track_variable(variable)
    return variable


def clone(optimizer: Any) -> Any:
    """An unbuilt optimizer of the same kind and configuration (weight-decay exclusions included)."""
    copy = optimizer.__class__.from_config(optimizer.get_config())
    for a, b in zip(_layers(optimizer), _layers(copy)):
        for name, value in vars(a).items():
            if name.startswith("_exclude_from_weight_decay"):
                setattr(b, name, value)
    return copy


@dataclasses.dataclass(frozen=True)
class Entry:
    """One optimizer variable of the full (unsharded) order: where it is kept and, for a slot, the index of
    the trainable variable it belongs to (None: one per optimizer, such as `iterations`)."""

    address: tuple
    variable: int | None


def full_layout(optimizer: Any, variables: Sequence[Any]) -> list[Entry]:
    """The order in which an unsharded `optimizer` built on `variables` lists (and saves) its variables.

    Found by building an unbuilt copy on `variables` whose `add_variable` makes scalar stand-ins, so nothing
    of the slots' size is allocated.

    Raises:
        ValueError: the optimizer keeps a variable that is neither one per optimizer nor in a list with one
            entry per trainable variable, so which worker owns it is unknown; naming the optimizer and it.
    """
    dry = clone(optimizer)
    for layer in _layers(dry):
        layer.add_variable = types.MethodType(_cheap_add_variable, layer)
    dry.build(list(variables))
    found = _addresses(dry, len(variables))
    entries = []
    for v in dry.variables:
        address = found.get(id(v))
        if address is None:
            raise ValueError(
                f"shard_optimizer_state=True cannot shard {type(optimizer).__name__}: it keeps the variable "
                f"{v.path!r} neither once per optimizer nor in a list with one entry per trainable variable, so "
                "no worker can be said to own it. Use shard_optimizer_state=False with this optimizer.")
        slot = len(address) > 1 and isinstance(address[-1], int)
        entries.append(Entry(address, address[-1] if slot else None))
    return entries


def gather_state(optimizer: Any, layout: Sequence[Entry], shard: Shard, options: ReductionOptions) -> list:
    """The full state, as numpy arrays in `layout`'s order, on every worker (collective: every worker calls it).

    One allgather per dtype, each worker's part padded to the longest (see all_gather_variables). The slots'
    shapes are exchanged once per shard: Adafactor's factored moments, say, are not shaped like their variable.
    """
    position = {var_id(v): p for p, v in enumerate(shard.owned())}

    def local_value(entry: Entry) -> Any:
        if entry.variable is None:
            return _resolve(optimizer, entry.address)
        return _resolve(optimizer, entry.address, position[var_id(shard.variables[entry.variable])])

    mine = {j: local_value(e) for j, e in enumerate(layout)
            if e.variable is not None and shard.owners[e.variable] == shard.rank}
    specs = shard.__dict__.get("_state_specs")
    if specs is None:
        specs = {}
        for part in C.allgather_object({j: (tuple(v.shape), tf.as_dtype(v.dtype).name) for j, v in mine.items()},
                                       name="hvdkeras.sharded.state_specs"):
            specs.update(part)
        object.__setattr__(shard, "_state_specs", specs)
    values: list = [None] * len(layout)
    for j, entry in enumerate(layout):
        if entry.variable is None or shard.owners[entry.variable] == EVERY:
            values[j] = np.asarray(local_value(entry).numpy())
    for dtype in sorted({d for _, d in specs.values()}):
        entries = [j for j in sorted(specs) if specs[j][1] == dtype]
        lengths = [sum(int(np.prod(specs[j][0])) for j in entries if shard.owners[layout[j].variable] == r)
                   for r in range(shard.size)]
        longest = max(lengths)
        flat = _flat([tf.convert_to_tensor(mine[j]) for j in entries if j in mine], dtype)
        if lengths[shard.rank] < longest:
            flat = tf.pad(flat, [[0, longest - lengths[shard.rank]]])
        full = C.allgather(flat, name=f"hvdkeras.sharded.state.{dtype}", process_set=options.process_set).numpy()
        offsets = [r * longest for r in range(shard.size)]
        for j in entries:
            owner = shard.owners[layout[j].variable]
            n = int(np.prod(specs[j][0]))
            values[j] = full[offsets[owner]:offsets[owner] + n].reshape(specs[j][0])
            offsets[owner] += n
    return values


def assign_state(optimizer: Any, layout: Sequence[Entry], shard: Shard, values: Sequence[Any]) -> None:
    """Sets this worker's part of the state from full-state `values` in `layout`'s order (no communication)."""
    position = {var_id(v): p for p, v in enumerate(shard.owned())}
    for entry, value in zip(layout, values):
        if entry.variable is None:
            _resolve(optimizer, entry.address).assign(value)
        elif shard.owns(shard.variables[entry.variable]):
            target = _resolve(optimizer, entry.address, position[var_id(shard.variables[entry.variable])])
            if target is not None:
                target.assign(value)


def broadcast_state(optimizer: Any, layout: Sequence[Entry], shard: Shard, values: Sequence[Any] | None,
                    root: int, slots_only: bool = False) -> bool:
    """Sets every worker's part of the state from `values` (the full state, in `layout`'s order) that `root`
    holds; the others pass None. Collective. Returns False, changing nothing, when root holds none.
    `slots_only`: leave the variables held once per optimizer (iterations, learning rate) as they are."""
    specs = C.broadcast_object(None if values is None else [(np.shape(v), np.asarray(v).dtype.name) for v in values],
                               root_rank=root, name="hvdkeras.sharded.restore_specs")
    if specs is None:
        return False
    position = {var_id(v): p for p, v in enumerate(shard.owned())}
    for j, (entry, (shape, dtype)) in enumerate(zip(layout, specs)):
        if slots_only and entry.variable is None:
            continue
        send = tf.convert_to_tensor(values[j]) if shard.rank == root else tf.zeros(shape, dtype=dtype)
        value = C.broadcast(send, root, name=f"hvdkeras.sharded.restore.{j}")
        if entry.variable is None:
            _resolve(optimizer, entry.address).assign(value)
        elif shard.owns(shard.variables[entry.variable]):
            _resolve(optimizer, entry.address, position[var_id(shard.variables[entry.variable])]).assign(value)
    return True


def rebuilt(optimizer: Any, shard: Shard) -> Any:
    """A fresh optimizer of the same kind built on this worker's part under `shard` (its slots at their initial
    values), before its state is set."""
    fresh = clone(optimizer)
    fresh.build(shard.owned())
    return fresh


def reshard(full: Any, shard: Shard) -> Any:
    """An optimizer built on this worker's variables only, with their state taken from `full`, an optimizer
    of the same kind already built on all of them (restored by load_model, say)."""
    built_on = list(_layers(full)[-1]._trainable_variables)
    layout = full_layout(full, built_on)
    values = [v.numpy() for v in full.variables]
    where = {var_id(v): i for i, v in enumerate(shard.variables)}
    # `full` may list the variables in another order than the shard: re-index each slot by variable.
    entries = [e if e.variable is None else Entry(e.address, where[var_id(built_on[e.variable])]) for e in layout]
    sharded = rebuilt(full, shard)
    assign_state(sharded, entries, shard, values)
    return sharded
