"""The optimizer's state in the owners' parts (ZeRO stages 1 and 2): the reduce-scatter reducer's
`optimizer_state` (DistributedOptimizer(shard_optimizer_state=True)).

hvdkeras.reduce.reduce_scatter partitions the trainable variables into pieces, reduces each piece's gradient to
its owner, and all-gathers the updated pieces. This module keeps the inner optimizer's side of it
(`ShardedState`): the optimizer is built on its owner's pieces only, so each slot (a moment, a velocity,
Adafactor's factored second moments) exists once in the job instead of once per worker.

`splittable` says which variables may be cut into runs of rows: those of Keras's optimizers whose update is
elementwise (SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta, Adamax, Nadam, Lion, Ftrl), without clipnorm (a
per-variable norm) and not excluded from weight decay. The owner of a piece updates a variable of the piece's
shape, set from the model's variable before each update, with the same elementwise math, so the result is
the same bits. Any other variable is owned whole, which keeps every per-variable rule exact and unmodified
(clipnorm, Adafactor's factored moments, Lamb's trust ratio, exclusions), and its owner updates the model's
own variable. The rules that span variables are made to span workers: global_clipnorm's norm and the
loss-scale optimizer's finiteness check are all-reduced.

Checkpoints hold the full state, in the order an unsharded optimizer of the same kind saves it, so plain
Keras loads them; `full_layout` maps that order onto each worker's part.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Sequence

import keras
import numpy as np
import tensorflow as tf
from keras.optimizers import LossScaleOptimizer

from hvdkeras import _collectives as C
from hvdkeras.reduce.base import OptimizerState
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.reduce.shard import Shard, pack
from hvdkeras.variables import var_id


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


ELEMENTWISE = (keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW, keras.optimizers.RMSprop,
               keras.optimizers.Adagrad, keras.optimizers.Adadelta, keras.optimizers.Adamax, keras.optimizers.Nadam,
               keras.optimizers.Lion, keras.optimizers.Ftrl)


def splittable(optimizer: Any) -> Callable[[Any], bool]:
    """Whether `optimizer`'s math may update a variable in pieces: its kind is one of Keras's elementwise
    optimizers (exactly: a subclass may change the update), it clips no per-variable norm, and the variable is
    not excluded from its weight decay."""
    base = _layers(optimizer)[-1]
    if type(base) not in ELEMENTWISE or base.clipnorm:
        return lambda variable: False
    if not base.weight_decay:
        return lambda variable: True
    return base._use_weight_decay


def install_cross_worker_rules(optimizer: Any, shard: Shard, options: ReductionOptions) -> None:
    """Makes the rules that span all variables span all workers, on this optimizer instance only:
    global_clipnorm's norm over every worker's gradients, and the loss-scale finiteness check (every worker
    skips a step where any worker's gradients overflow)."""
    for layer in _layers(optimizer):
        if isinstance(layer, LossScaleOptimizer):
            layer.check_finite = _all_finite(layer, options.process_set)
        elif layer.global_clipnorm:
            if shard.has_local():
                raise ValueError(
                    "shard_optimizer_state=True cannot combine `global_clipnorm` with local variables "
                    "(PartialDistributedOptimizer, register_local_var): the norm would count each worker's local "
                    f"gradients once per worker. Received: global_clipnorm={layer.global_clipnorm}")
            layer._clip_gradients = _global_clip(layer, options.process_set)
            layer._hvdkeras_norm_workers = shard.size


def check_update_gradients(optimizer: Any, grads: Sequence[Any]) -> None:
    """Raises where this worker's update would leave the others waiting for it: its global_clipnorm's norm spans
    the workers (`install_cross_worker_rules`), and none of the variables it updates has a gradient (Keras clips
    only where there are gradients).

    Raises:
        ValueError: saying so, and what to do.
    """
    spans = any(getattr(layer, "_hvdkeras_norm_workers", 1) > 1 for layer in _layers(optimizer))
    if spans and all(g is None for g in grads):
        raise ValueError(
            "shard_optimizer_state=True with `global_clipnorm`: none of the variables this worker owns has a "
            f"gradient in this step, so it cannot add its part of the norm. Received: {len(grads)} owned "
            "variables, all without gradients. Leave them out of the trainable variables or do not shard.")


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


def _positions(shard: Shard) -> dict[int, int]:
    """The index of each variable this worker updates (a piece or the whole) -> its place in the built order."""
    return {i: p for p, i in enumerate(shard.owned_indices())}


def gather_state(optimizer: Any, layout: Sequence[Entry], shard: Shard, options: ReductionOptions) -> list:
    """The full state, as numpy arrays in `layout`'s order, on every worker (collective: every worker calls it).

    One allgather per dtype, each worker's part padded to the longest (see all_gather_variables); a slot of a
    variable cut into pieces is its owners' slots joined along the first axis, in row order. The slots'
    shapes are exchanged once per shard: Adafactor's factored moments, say, are not shaped like their variable.
    """
    position = _positions(shard)

    def local_value(entry: Entry) -> Any:
        if entry.variable is None:
            return _resolve(optimizer, entry.address)
        return _resolve(optimizer, entry.address, position[entry.variable])

    mine = {j: local_value(e) for j, e in enumerate(layout) if e.variable is not None and shard.holds(e.variable)}
    specs = shard.__dict__.get("_state_specs")
    if specs is None:
        specs = C.allgather_object({j: (tuple(v.shape), tf.as_dtype(v.dtype).name) for j, v in mine.items()},
                                   name="hvdkeras.sharded.state_specs")
        object.__setattr__(shard, "_state_specs", specs)
    values: list = [None] * len(layout)
    for j, entry in enumerate(layout):
        if entry.variable is None or shard.is_local(shard.variables[entry.variable]):
            values[j] = np.asarray(local_value(entry).numpy())
    found: dict[int, dict[int, np.ndarray]] = {}
    for dtype in sorted({d for part in specs for _, d in part.values()}):
        entries = [sorted(j for j in part if part[j][1] == dtype) for part in specs]
        lengths = [sum(int(np.prod(specs[r][j][0])) for j in entries[r]) for r in range(shard.size)]
        longest = max(lengths)
        flat = pack([tf.convert_to_tensor(mine[j]) for j in entries[shard.rank]], dtype)
        if lengths[shard.rank] < longest:
            flat = tf.pad(flat, [[0, longest - lengths[shard.rank]]])
        full = C.allgather(flat, name=f"hvdkeras.sharded.state.{dtype}", process_set=options.process_set).numpy()
        for r in range(shard.size):
            offset = r * longest
            for j in entries[r]:
                shape = specs[r][j][0]
                n = int(np.prod(shape))
                found.setdefault(j, {})[r] = full[offset:offset + n].reshape(shape)
                offset += n
    for j, by_owner in found.items():
        owners = [p.owner for p in shard.pieces[layout[j].variable]]
        values[j] = by_owner[owners[0]] if len(owners) == 1 else np.concatenate([by_owner[r] for r in owners], axis=0)
    return values


def assign_state(optimizer: Any, layout: Sequence[Entry], shard: Shard, values: Sequence[Any]) -> None:
    """Sets this worker's part of the state from full-state `values` in `layout`'s order (no communication)."""
    position = _positions(shard)
    for entry, value in zip(layout, values):
        if entry.variable is None:
            _resolve(optimizer, entry.address).assign(value)
        elif entry.variable in position:
            target = _resolve(optimizer, entry.address, position[entry.variable])
            if target is not None:
                target.assign(shard.part(entry.variable, value))


def broadcast_state(optimizer: Any, layout: Sequence[Entry], shard: Shard, values: Sequence[Any] | None,
                    root: int, slots_only: bool = False) -> bool:
    """Sets every worker's part of the state from `values` (the full state, in `layout`'s order) that `root`
    holds; the others pass None. Collective. Returns False, changing nothing, when root holds none.
    `slots_only`: leave the variables held once per optimizer (iterations, learning rate) as they are."""
    specs = C.broadcast_object(None if values is None else [(np.shape(v), np.asarray(v).dtype.name) for v in values],
                               root_rank=root, name="hvdkeras.sharded.restore_specs")
    if specs is None:
        return False
    position = _positions(shard)
    for j, (entry, (shape, dtype)) in enumerate(zip(layout, specs)):
        if slots_only and entry.variable is None:
            continue
        send = tf.convert_to_tensor(values[j]) if shard.rank == root else tf.zeros(shape, dtype=dtype)
        value = C.broadcast(send, root, name=f"hvdkeras.sharded.restore.{j}")
        if entry.variable is None:
            _resolve(optimizer, entry.address).assign(value)
        elif entry.variable in position:
            _resolve(optimizer, entry.address, position[entry.variable]).assign(shard.part(entry.variable, value))
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


class ShardedState(OptimizerState):
    """The inner optimizer's state in parts, for `reducer` (a ReduceScatterReducer, whose `shard` says who owns
    which variable): built on this worker's variables, saved and loaded in full (gathered from and shared
    among the workers), re-sharded after a resize."""

    collective = True
    compilable = False  # a sharded update holds collectives: the all-reduced norm or finiteness check

    def __init__(self, reducer: Any):
        self._reducer = reducer
        self._layout: list[Entry] | None = None  # the unsharded optimizer's variable order, found when first needed
        self._gathered: list | None = None  # the full state gathered by consolidate, until the next save
        self._loaded: list | None = None  # the full state rank 0 alone loaded, until share_loaded
        # False: every variable owned whole, as before variables were cut into pieces (to compare against).
        self.split_variables = True

    def __repr__(self) -> str:
        return f"ShardedState({self._reducer!r})"

    @property
    def _shard(self) -> Shard:
        return self._reducer.shard

    def layout(self, optimizer: Any) -> list[Entry]:
        """The order of the full state (`full_layout`), found once."""
        if self._layout is None:
            self._layout = full_layout(optimizer, self._shard.variables)
        return self._layout

    def prepare(self, optimizer: Any) -> None:
        self._reducer.splittable = splittable(optimizer) if self.split_variables else None

    def build(self, optimizer: Any, updated: Sequence[Any]) -> Any:
        # Keras may build inside the traced train step; the state's layout is read from eager copies.
        with tf.init_scope():
            if optimizer.built:  # restored in full (load_model), then wrapped: keep this worker's part
                optimizer = reshard(optimizer, self._shard)
            else:
                optimizer.build(list(updated))
            install_cross_worker_rules(optimizer, self._shard, self._reducer.options)
            self.layout(optimizer)  # an optimizer that cannot be sharded says so now, not at the first save
        return optimizer

    def rebuild(self, optimizer: Any, values: Any, root_rank: int) -> Any:
        with tf.init_scope():
            self._reducer.build(self._shard.variables)  # the partition over the workers there are now
            optimizer = rebuilt(optimizer, self._shard)
            install_cross_worker_rules(optimizer, self._shard, self._reducer.options)
            broadcast_state(optimizer, self.layout(optimizer), self._shard, values, root_rank, slots_only=True)
        return optimizer

    def check_update(self, optimizer: Any, grads: Sequence[Any]) -> None:
        check_update_gradients(optimizer, grads)

    def finalize(self, optimizer: Any, variables: Sequence[Any]) -> None:
        variables = list(variables)
        self._shard.refresh()
        optimizer.finalize_variable_values(self._reducer.updated(variables))
        self._reducer.share_updated(variables)

    def save(self, optimizer: Any, store: Any, alone: bool) -> None:
        values, self._gathered = self._gathered, None
        if values is None:
            if alone:
                raise RuntimeError(
                    "This optimizer's state is sharded across the workers (shard_optimizer_state=True), and it is "
                    "being saved on rank 0 alone, where the other workers' parts cannot be gathered. Call "
                    "`optimizer.consolidate_state()` on every worker before a rank-0-only save, or save with "
                    "hvdkeras.callbacks.ModelCheckpoint / BackupAndRestore, which do it.")
            values = self.gather(optimizer)
        for j, value in enumerate(values):
            store[str(j)] = value

    def load(self, optimizer: Any, store: Any, alone: bool) -> None:
        layout = self.layout(optimizer)
        if len(store.keys()) != len(layout):
            kind = type(_layers(optimizer)[-1]).__name__
            raise ValueError(
                f"The saved optimizer state has {len(store.keys())} variables, and {kind} "
                f"built on these {len(self._shard.variables)} trainable variables has {len(layout)}: the file "
                "was saved from another model or optimizer.")
        values = [store[str(j)] for j in range(len(layout))]
        assign_state(optimizer, layout, self._shard, values)
        if alone:  # loaded on one worker only: kept for share_loaded, the others' parts too
            self._loaded = [np.asarray(v) for v in values]

    def gather(self, optimizer: Any) -> list:
        return gather_state(optimizer, self.layout(optimizer), self._shard, self._reducer.options)

    def consolidate(self, optimizer: Any) -> None:
        self._gathered = self.gather(optimizer)

    def share_loaded(self, optimizer: Any, root_rank: int) -> bool:
        values, self._loaded = self._loaded, None
        return broadcast_state(optimizer, self.layout(optimizer), self._shard, values, root_rank)

    def slots(self, optimizer: Any) -> list:
        return slots(optimizer)
