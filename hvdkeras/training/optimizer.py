"""DistributedOptimizer: a Keras 3 optimizer that all-reduces gradients before the inner optimizer applies them.

Keras 3's TensorFlow train step runs `tape.gradient -> optimizer.apply_gradients -> optimizer.apply`, so the
reduction happens in `apply`: accumulate, reduce (its reducer, hvdkeras.reduce), the inner optimizer's update,
after-apply. The wrapper holds the inner optimizer the way
Keras's own LossScaleOptimizer does: the inner optimizer owns the slots, learning rate, schedule and
iteration count, and the wrapper's properties read them there.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras.optimizers import LossScaleOptimizer

from hvdkeras import _collectives as C
from hvdkeras import compression as _compression
from hvdkeras import patches
from hvdkeras._checks import check_number
from hvdkeras.reduce import BUILT_IN, Reducer, make_reducer
from hvdkeras.reduce.allreduce import reduce_gradients
from hvdkeras.reduce.context import in_xla_context, reducing
from hvdkeras.reduce.options import OPS_BY_NAME, ReductionOptions
from hvdkeras.training import rank_zero
from hvdkeras.training.learning_rate import as_float
from hvdkeras.training.strategy import check_strategy
from hvdkeras.variables import VariableList, var_id

log = logging.getLogger("hvdkeras")


def _check_inner(optimizer: Any) -> None:
    if isinstance(optimizer, type):
        raise TypeError(
            "`optimizer` must be an optimizer instance, not a class; for example "
            f"keras.optimizers.SGD(0.01). Received: optimizer={optimizer!r}"
        )
    if isinstance(optimizer, DistributedOptimizer):
        raise ValueError(
            "`optimizer` is already a DistributedOptimizer; wrapping it twice would reduce every "
            f"gradient twice. Received: optimizer={optimizer!r}"
        )
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "`optimizer` must be a Keras 3 optimizer instance (a keras.optimizers.Optimizer, such as "
            "keras.optimizers.Adam()); tf.keras / Keras 2 optimizers and strings are not accepted. "
            f"Received: optimizer={optimizer!r} of type {type(optimizer).__module__}.{type(optimizer).__name__}"
        )
    lr = getattr(unwrap(optimizer), "_learning_rate", None)
    if isinstance(lr, keras.Variable):
        check_number("learning_rate", as_float(lr), what="a number (the optimizer's learning rate)")


def _wants_loss_scaling(optimizer: Any) -> bool:
    if isinstance(optimizer, LossScaleOptimizer):
        return True
    return (
        isinstance(optimizer, keras.optimizers.Optimizer)
        and not isinstance(optimizer, DistributedOptimizer)
        and keras.mixed_precision.global_policy().name == "mixed_float16"
    )


def _option(name: str) -> property:
    return property(lambda self: getattr(self.options, name), doc=f"`options.{name}` (read-only).")


def _inner(name: str) -> property:
    def get(self):
        return getattr(self.inner_optimizer, name)

    def set_(self, value):
        setattr(self.inner_optimizer, name, value)

    return property(get, set_, doc=f"The inner optimizer's `{name}`.")


def _check_reducer(reducer: Any, shard_optimizer_state: bool) -> bool:
    """Whether the state is sharded, from `reducer` and its shorthand `shard_optimizer_state`.

    Raises:
        TypeError: `reducer` is neither a built-in's name nor a Reducer.
        ValueError: both given, naming different reducers.
    """
    if reducer is None or isinstance(reducer, Reducer):
        if isinstance(reducer, Reducer) and shard_optimizer_state:
            raise ValueError("Pass `reducer` or `shard_optimizer_state=True` (the reduce-scatter reducer), not both. "
                             f"Received: reducer={reducer!r}, shard_optimizer_state=True")
        return bool(shard_optimizer_state)
    if not isinstance(reducer, str) or reducer not in BUILT_IN:
        raise TypeError(f"`reducer` must be one of {', '.join(map(repr, BUILT_IN))} or an hvdkeras.reduce.Reducer. "
                        f"Received: reducer={reducer!r}")
    if reducer == "allreduce" and shard_optimizer_state:
        raise ValueError("`shard_optimizer_state=True` is the reduce-scatter reducer, and `reducer` names the "
                         "allreduce. Received: reducer='allreduce', shard_optimizer_state=True")
    return reducer == "reduce_scatter"


@keras.saving.register_keras_serializable(package="hvdkeras")
class DistributedOptimizer(keras.optimizers.Optimizer):
    """Wraps a Keras 3 optimizer so gradients are averaged across all workers before every update.

    Each worker computes gradients on its own shard of the global batch; `apply` all-reduces them (dense
    gradients in buckets of `bucket_bytes`, one fused allreduce per bucket and dtype, in the order the
    backward pass produces them, so communication overlaps the rest of the backward pass; sparse ones are
    allgathered) and hands the result to the inner optimizer, so all model copies stay identical and N
    workers train like one worker on N times the batch.

    Mixed precision: when `optimizer` is a `LossScaleOptimizer`, or the global dtype policy is
    `mixed_float16`, the result is a `DistributedLossScaleOptimizer`, which holds the loss scaling: its inner
    optimizer is the `LossScaleOptimizer` (made here around `optimizer` under the policy, as `compile` would),
    which checks the reduced gradients, so all workers skip an overflowing step together. `compile` keeps it as
    it is (see `install_loss_scale_passthrough`). Create the optimizer after setting the policy.

    Args:
        optimizer: the Keras 3 optimizer instance to wrap (SGD, Adam, AdamW, a LossScaleOptimizer, ...).
        compression: `hvdkeras.Compression.none` or `hvdkeras.Compression.fp16` (send float gradients as
            float16).
        op: `hvdkeras.Average` (default) or `hvdkeras.Sum`.
        backward_passes_per_step: accumulate gradients locally over this many `apply` calls and communicate
            and apply them once. As in Horovod, `iterations` counts the backward passes (every `apply`
            call), and a learning-rate schedule is evaluated at that count.
        average_aggregated_gradients: divide the locally accumulated gradients by
            `backward_passes_per_step` before they are reduced. The default, False, is Horovod's: the k
            passes are summed. True makes k passes one step on a k times larger batch.
        sparse_as_dense: reduce `tf.IndexedSlices` gradients (from `Embedding`) as dense tensors instead of
            allgathering them.
        gradient_predivide_factor: with `op=Average`, divide by this before the sum and by
            `size() / gradient_predivide_factor` after it.
        groups: None (the dense gradients are reduced in buckets, see `bucket_bytes`), an integer n (n
            fused allreduces of about equal numbers of gradients), or a list of lists of variables (one fused
            allreduce per list; variables in no list are reduced one by one).
        name: the optimizer's name; defaults to "distributed_<inner name>".
        device_dense: device for the dense reductions ("" lets TensorFlow choose).
        device_sparse: device for the sparse (allgather) reductions.
        num_groups: deprecated form of `groups=n` (as in Horovod).
        process_set: reduce among the ranks of this `hvdkeras.ProcessSet` only (default: all workers).
        scale_local_gradients: divide the gradients of local variables (`register_local_var`,
            `PartialDistributedOptimizer`) by the number of workers, as Horovod does.
        bucket_bytes: with `groups=None`, reduce the dense gradients in buckets of about this many bytes, in
            the order the backward pass produces them (the last layers first): each bucket is one fused
            allreduce that starts as soon as its gradients exist, while the backward pass computes the
            rest. 0: one fused allreduce for all of them. None (default): $HVDKERAS_BUCKET_BYTES if set,
            else DEFAULT_BUCKET_BYTES (64 KiB).
        shard_optimizer_state: keyword only. Shard the inner optimizer's state across the workers (ZeRO):
            each slot lives on one worker only (about 1/N of the state on each: an elementwise optimizer's
            variables are cut into runs of rows, the others owned whole), each reduced gradient reaches its
            owner only, and the updated parts are all-gathered into every worker's weights before the next
            step. Training is the same training; `variables` holds this worker's part, and saving gathers
            the whole state (every worker must take part: see docs/sharding.md). The shorthand for
            `reducer="reduce_scatter"`.
        reducer: keyword only. How the gradients are reduced (hvdkeras.reduce): "allreduce" (the default),
            "reduce_scatter" (as `shard_optimizer_state=True`), or an `hvdkeras.reduce.Reducer` instance. A
            Reducer instance is not saved with the optimizer's config.

    The parameters up to `scale_local_gradients` are Horovod's, in Horovod's order and with its defaults.

    Raises:
        TypeError: `optimizer` is not a Keras 3 optimizer instance.
        ValueError: an invalid option, or `optimizer` is already distributed.

    Example:
        >>> opt = hvdkeras.DistributedOptimizer(keras.optimizers.Adam(hvdkeras.scale_learning_rate(1e-3)))
        >>> model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    """

    # The options it was made with, read-only: each is the field of `options` (a ReductionOptions) of that name.
    compression = _option("compression")
    sparse_as_dense = _option("sparse_as_dense")
    gradient_predivide_factor = _option("gradient_predivide_factor")
    op = _option("op")
    backward_passes_per_step = _option("backward_passes_per_step")
    average_aggregated_gradients = _option("average_aggregated_gradients")
    groups = _option("groups")
    device_dense = _option("device_dense")
    device_sparse = _option("device_sparse")
    process_set = _option("process_set")
    scale_local_gradients = _option("scale_local_gradients")
    bucket_bytes = _option("bucket_bytes")
    shard_optimizer_state = _option("shard_optimizer_state")
    # The hyperparameters of Keras's own optimizers, read and set on the optimizer passed in (an SGD's
    # `momentum`, an Adam's `beta_1`, ...). tests/unit/test_optimizer.py checks that they cover every
    # keras.optimizers class and hide nothing the base optimizer has.
    adam_beta_1 = _inner("adam_beta_1")
    adam_beta_2 = _inner("adam_beta_2")
    adam_lr_ratio = _inner("adam_lr_ratio")
    adam_weight_decay = _inner("adam_weight_decay")
    amsgrad = _inner("amsgrad")
    beta = _inner("beta")
    beta_1 = _inner("beta_1")
    beta_2 = _inner("beta_2")
    beta_2_decay = _inner("beta_2_decay")
    centered = _inner("centered")
    clip_threshold = _inner("clip_threshold")
    epsilon = _inner("epsilon")
    epsilon_1 = _inner("epsilon_1")
    epsilon_2 = _inner("epsilon_2")
    exclude_embeddings = _inner("exclude_embeddings")
    exclude_layers = _inner("exclude_layers")
    initial_accumulator_value = _inner("initial_accumulator_value")
    l1_regularization_strength = _inner("l1_regularization_strength")
    l2_regularization_strength = _inner("l2_regularization_strength")
    l2_shrinkage_regularization_strength = _inner("l2_shrinkage_regularization_strength")
    learning_rate_power = _inner("learning_rate_power")
    momentum = _inner("momentum")
    muon_a = _inner("muon_a")
    muon_b = _inner("muon_b")
    muon_c = _inner("muon_c")
    nesterov = _inner("nesterov")
    ns_steps = _inner("ns_steps")
    relative_step = _inner("relative_step")
    rho = _inner("rho")
    rms_rate = _inner("rms_rate")
    warmup_steps = _inner("warmup_steps")

    def __new__(cls, optimizer: Any = None, *args: Any, **kwargs: Any):
        # Around a LossScaleOptimizer, or under the mixed_float16 policy, `DistributedOptimizer(...)` makes the
        # subclass that holds the loss scaling (its __init__ then runs with the same arguments).
        if cls is DistributedOptimizer and _wants_loss_scaling(optimizer):
            cls = DistributedLossScaleOptimizer
        return super().__new__(cls)

    def __init__(
        self,
        optimizer: keras.optimizers.Optimizer,
        name: str | None = None,
        device_dense: str = "",
        device_sparse: str = "",
        compression: Any = _compression.Compression.none,
        sparse_as_dense: bool = False,
        gradient_predivide_factor: float = 1.0,
        op: int = C.Average,
        backward_passes_per_step: int = 1,
        average_aggregated_gradients: bool = False,
        num_groups: int = 0,
        groups: Any = None,
        process_set: Any = C.global_process_set,
        scale_local_gradients: bool = True,
        bucket_bytes: int | None = None,
        *,
        shard_optimizer_state: bool = False,
        reducer: Reducer | str | None = None,
    ):
        _check_inner(optimizer)
        check_strategy()
        shard_optimizer_state = _check_reducer(reducer, shard_optimizer_state)
        options = ReductionOptions.from_horovod(
            num_groups=num_groups, groups=groups, device_dense=device_dense, device_sparse=device_sparse,
            compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
            scale_local_gradients=scale_local_gradients, bucket_bytes=bucket_bytes,
            shard_optimizer_state=shard_optimizer_state)
        super().__init__(learning_rate=0.0, name=name or f"distributed_{optimizer.name}")
        self.inner_optimizer = optimizer
        self.options = options
        install_compile_config()
        self._local_vars: list = []
        self._local_layers: list = []
        self._accumulators: list = []
        self._pass_counter = None
        # How the gradients are reduced; with shard_optimizer_state its `shard` says who owns which variable.
        self._reducer = reducer if isinstance(reducer, Reducer) else make_reducer(options, self._local_set)
        if isinstance(reducer, Reducer):
            reducer.bind(options, self._local_set)
        self._gathered_workers = None  # every worker's own reducer state, gathered by consolidate_state
        self._loaded_workers = None  # every worker's own reducer state rank 0 alone loaded, until shared
        # Set by hvdkeras.training.xla for a model that keeps XLA: the inner optimizer's update, after the reduction, is
        # compiled with XLA as Keras's own compiled step compiles it (where the reducer's optimizer_state is
        # `compilable`: a sharded update holds collectives, the all-reduced norm or finiteness check).
        self.xla_update = False
        self._compiled_updates: dict = {}

    # ----------------------------------------------------------------- state held by the inner optimizer
    learning_rate = _inner("learning_rate")
    iterations = property(lambda self: self.inner_optimizer.iterations,
                          doc="The inner optimizer's iteration count.")

    @property
    def variables(self):
        """The inner optimizer's variables, then (only with backward_passes_per_step > 1) the accumulators, then
        the reducer's state (none for the built-in reducers)."""
        extra = [self._pass_counter, *self._accumulators] if self._pass_counter is not None else []
        return VariableList(self.inner_optimizer.variables + extra + list(self._reducer.state()))

    def save_own_variables(self, store):
        # The inner optimizer's state: the file is what a plain Keras optimizer saves and loads. Then the
        # reducer's state, numbered after it (none for the built-in reducers, whose files are plain Keras's).
        # The accumulators are empty at every update (where checkpoints are taken) and start empty.
        self._save_inner_variables(store)
        state = self._extra_state()
        if state:
            first = len(store.keys())
            own = {id(v) for v in self._worker_state()}
            gathered, self._gathered_workers = self._gathered_workers, None
            for k, variable in enumerate(state):
                if id(variable) not in own:
                    store[str(first + k)] = variable.numpy()
                elif gathered is not None:  # every worker's, stacked (consolidate_state)
                    store[str(first + k)] = gathered[id(variable)]
                else:  # a save without the others (no consolidate_state): this worker's alone
                    store[str(first + k)] = variable.numpy()[None]

    def load_own_variables(self, store):
        state = self._extra_state()
        if not state:
            self._load_inner_variables(store)
            return
        count = len(store.keys())
        if count < len(state):
            raise ValueError(f"The saved optimizer state has {count} variables, fewer than the {len(state)} of the "
                             f"reducer's state ({type(self._reducer).__name__}): it was saved with another reducer.")
        inner = count - len(state)
        self._load_inner_variables({str(j): store[str(j)] for j in range(inner)})
        own = {id(v) for v in self._worker_state()}
        stacked = {}
        for k, variable in enumerate(state):
            value = np.asarray(store[str(inner + k)])
            if id(variable) in own:
                stacked[str(k)] = value  # every worker's value, stacked
            else:
                variable.assign(value)
        if rank_zero.in_solo():  # rank 0 loading alone (a restored backup): all kept for share_loaded_state
            self._loaded_workers = stacked or None
        self._own_rows_after_inner_load(self._take_own(stacked, alone=rank_zero.in_solo()))

    def _own_rows_after_inner_load(self, rows: list) -> None:
        """Keras loads the wrapped optimizers' own file entries (rank 0's slots) after this optimizer's, the
        innermost last: a worker's own slots, just assigned, are assigned again right after that load (once)."""
        inner = unwrap(self)  # under a LossScaleOptimizer, the optimizer that owns the slots
        mine = {id(v) for v in inner.variables}
        if not any(id(v) in mine for v, _ in rows):
            return

        def load_then_own(store):
            del inner.load_own_variables  # once: the class's method again
            inner.load_own_variables(store)
            for variable, row in rows:
                variable.assign(row)

        inner.load_own_variables = load_then_own

    def _save_inner_variables(self, store):
        self._state.save(self.inner_optimizer, store, alone=rank_zero.in_solo())

    def _load_inner_variables(self, store):
        self._state.load(self.inner_optimizer, store, alone=rank_zero.in_solo())

    def share_loaded_state(self, root_rank: int = 0) -> bool:
        """Gives every worker its part of the state `root_rank` alone loaded (a restored backup): its shard of
        a sharded state, and its own of the reducer's state of each worker's own. Collective.

        Returns:
            Whether root_rank had loaded one (each worker then holds its part of it).
        """
        shared = self._state.share_loaded(self.inner_optimizer, root_rank)
        if self._worker_state():
            values, self._loaded_workers = self._loaded_workers, None
            # A plain dict (an optimizer's attributes are tracked by Keras, in wrappers that do not pickle).
            values = None if values is None else {str(k): np.asarray(v) for k, v in values.items()}
            values = C.broadcast_object(values, root_rank=root_rank)
            if values is not None:
                self._take_own(values)
                shared = True
        return shared

    def _take_own(self, values: dict, alone: bool = False) -> list:
        """Each worker's own state from every worker's, stacked (by position in `_extra_state()`): this worker's
        row where the rows are the job's workers (or, `alone`, rank 0 loading by itself: its row of whatever
        was saved). Rows of another number of workers make the reducer reset (and say so), except `alone`, where
        that waits for share_loaded_state. Returns the (variable, row) pairs assigned."""
        rank, size = (C.rank(), C.size()) if C.is_initialized() else (0, 1)
        state = self._extra_state()
        assigned, sizes = [], set()
        for key, value in values.items():
            sizes.add(value.shape[0])
            if value.shape[0] == size or alone and value.shape[0] > rank:
                state[int(key)].assign(value[rank])
                assigned.append((state[int(key)], value[rank]))
        if not alone:
            for saved in sizes - {size}:
                self._reducer.resized(saved, size)
        return assigned

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    @property
    def reducer(self) -> Reducer:
        """How the gradients are reduced (an `hvdkeras.reduce.Reducer`)."""
        return self._reducer

    @property
    def _state(self):
        # How the inner optimizer keeps its state: whole, or in the workers' parts (the reduce-scatter's).
        return self._reducer.optimizer_state

    # ----------------------------------------------------------------------------------- sharded state
    @property
    def sharded(self) -> bool:
        """Whether this worker holds only its part of the state (shard_optimizer_state=True, once built)."""
        return self._reducer.shard is not None

    def gather_state(self) -> list:
        """The inner optimizer's full state, as numpy arrays in the order a plain Keras optimizer of its kind
        saves them, on every worker. Collective: every worker must call it."""
        return self._state.gather(self.inner_optimizer)

    def consolidate_state(self) -> None:
        """Gathers the full state now, on every worker, for the next save: so rank 0 alone can save afterwards.

        Collective: every worker calls it, then rank 0 calls `model.save` (as PyTorch's
        ZeroRedundancyOptimizer.consolidate_state_dict). Without it, a sharded optimizer gathers when
        `model.save` is called, which every worker must then do. A no-op without sharding.
        """
        self._state.consolidate(self.inner_optimizer)
        own = self._worker_state()
        if own:
            self._gathered_workers = {
                id(v): C.allgather(tf.convert_to_tensor(v)[None], name=f"hvdkeras.reducer_state.{k}").numpy()
                for k, v in enumerate(own)}

    @property
    def saves_collectively(self) -> bool:
        """Whether a checkpoint of this optimizer needs every worker (consolidate_state before rank 0 saves,
        share_loaded_state after rank 0 loads): its state is sharded, or its reducer keeps state of each
        worker's own."""
        return self._state.collective or bool(self._worker_state())

    def _local_slots(self) -> list:
        """The inner optimizer's slots when each worker updates alone between synchronisations (local SGD,
        DiLoCo): each worker's own, not averaged (its step count and learning rate are the same on all)."""
        if not self._reducer.updates_locally:
            return []
        base = unwrap(self)
        shared = {id(base.iterations), id(getattr(base, "_learning_rate", None))}
        return [v for v in self.inner_optimizer.variables if id(v) not in shared]

    def _extra_state(self) -> list:
        """What a checkpoint holds after the inner optimizer's own variables: the reducer's state, then (for a
        reducer that updates locally) every worker's copy of the inner optimizer's slots."""
        return [*self._reducer.state(), *self._local_slots()]

    def _worker_state(self) -> list:
        """The saved variables whose values are each worker's own (saved stacked, one row per worker)."""
        return [*self._reducer.worker_state(), *self._local_slots()]

    def shard_variables(self) -> list:
        """This worker's own slots, which differ between workers (sharded); empty when not sharded."""
        return self._state.slots(self.inner_optimizer)

    def finalize_variable_values(self, var_list):
        self._state.finalize(self.inner_optimizer, var_list)

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        self.inner_optimizer.exclude_from_weight_decay(var_list=var_list, var_names=var_names)

    # --------------------------------------------------------------------------------- local variables
    def register_local_var(self, var: Any) -> None:
        """Keeps `var` local to each worker, as Horovod's `register_local_var`: its gradient is not reduced
        (and is divided by the number of workers when `scale_local_gradients`)."""
        if not isinstance(var, (keras.Variable, tf.Variable)):
            raise TypeError(f"`var` must be a keras.Variable or tf.Variable. Received: var={var!r}")
        self._local_vars.append(var)

    def _local_ids(self) -> set[int]:
        # Layers given to PartialDistributedOptimizer may be built after it was created (Keras 3 builds
        # models lazily): their variables are looked up when gradients are reduced.
        variables = self._local_vars + [v for layer in self._local_layers for v in layer.trainable_weights]
        return {var_id(v) for v in variables}

    # ------------------------------------------------------------------------------------------ building
    def build(self, var_list):
        var_list = list(var_list)
        if self.backward_passes_per_step > 1:
            self._pass_counter = self.add_variable(
                shape=(), dtype="int", initializer="zeros", aggregation="none", name="backward_passes"
            )
            self._accumulators = [
                self.add_variable_from_reference(v, name="gradient_accumulator") for v in var_list
            ]
        with tf.init_scope():  # the reducer's state variables are made outside a traced step
            self._state.prepare(self.inner_optimizer)
            self._reducer.build(var_list)
        self.inner_optimizer = self._state.build(self.inner_optimizer, self._reducer.updated(var_list))
        super().build(var_list)

    def reshard(self, values: Any = None, root_rank: int = 0) -> None:
        """Re-shards the state over the workers there are now (after an elastic resize), taking the slots from
        `values`, the full state (`gather_state()`'s result) that `root_rank` holds. Collective: every worker
        calls it; the others pass None. A no-op without sharding."""
        self.inner_optimizer = self._state.rebuild(self.inner_optimizer, values, root_rank)

    # ------------------------------------------------------------------------------------------ applying
    def apply(self, grads, trainable_variables=None):
        """Reduces `grads` across workers, then lets the inner optimizer apply them."""
        grads = list(grads)
        if not grads:
            return
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "When passing `grads` without `variables`, the optimizer must already be built on a "
                    "list of variables. Call `optimizer.build(trainable_variables)` first."
                )
            trainable_variables = self._trainable_variables
        else:
            trainable_variables = list(trainable_variables)
            if not self.built:
                with keras.name_scope(self.name, caller=self):
                    self.build(trainable_variables)
                self.built = True
        if len(grads) != len(trainable_variables):
            raise ValueError(
                "`grads` and `trainable_variables` must have the same length. "
                f"Received: {len(grads)} gradients for {len(trainable_variables)} variables"
            )
        check_strategy()
        if in_xla_context():
            raise RuntimeError(
                "Horovod's collectives cannot be compiled by XLA, and this optimizer is being traced inside "
                "an XLA-compiled function. Pass an hvdkeras callback (BroadcastGlobalVariablesCallback, "
                "MetricAverageCallback, ...) to fit, which keeps XLA for the forward and backward pass only "
                "(or turns it off, with a warning, for a model with its own train_step), or compile the model "
                "with jit_compile=False, or keep DistributedOptimizer.apply outside "
                "tf.function(jit_compile=True)."
            )
        with reducing():
            if self.backward_passes_per_step == 1:
                self._reduce_and_apply(grads, trainable_variables)
            else:
                self._accumulate_and_apply(grads, trainable_variables)

    def _accumulate_and_apply(self, grads, trainable_variables):
        accs = [self._accumulators[self._get_variable_index(v)] for v in trainable_variables]
        for g, acc in zip(grads, accs):
            if g is not None:
                acc.assign_add(tf.cast(tf.convert_to_tensor(g), acc.dtype))
        self._pass_counter.assign_add(1)

        def apply_accumulated():
            scale = 1.0 / self.backward_passes_per_step if self.average_aggregated_gradients else 1.0
            total = [None if g is None else tf.convert_to_tensor(acc) * scale for g, acc in zip(grads, accs)]
            self._reduce_and_apply(total, trainable_variables)
            for acc in accs:
                acc.assign(tf.zeros(acc.shape, dtype=acc.dtype))

        def count_pass():
            # As Horovod: `iterations` counts backward passes, so a pass that only accumulates counts too
            # (the inner optimizer counts the pass that applies), and a schedule sees the pass count.
            self.iterations.assign_add(1)

        keras.ops.cond(
            tf.equal(self._pass_counter % self.backward_passes_per_step, 0),
            apply_accumulated,
            count_pass,
        )

    def _reduce_and_apply(self, grads, trainable_variables):
        """Reduce, the inner optimizer's update of what the reducer returned, after-apply: the same for every
        reducer."""
        reduced = self._reducer.reduce(grads, trainable_variables)
        self._state.check_update(self.inner_optimizer, reduced.grads)
        self._update(reduced.grads, reduced.variables)
        self._reducer.after_apply(reduced)

    def _update(self, grads: list, variables: list) -> None:
        """The inner optimizer's update of the reduced gradients: compiled with XLA when `xla_update` is on
        (one compiled function per list of variables, which it holds; the gradients are its arguments)."""
        if not self.xla_update or not self._state.compilable:
            self.inner_optimizer.apply(grads, variables)
            return
        key = tuple(id(v) for v in variables)
        compiled = self._compiled_updates.get(key)
        if compiled is None:
            inner = self.inner_optimizer
            compiled = tf.function(lambda g: inner.apply(g, variables), jit_compile=True, reduce_retracing=True)
            self._compiled_updates[key] = compiled
        compiled(list(grads))

    def reduce_gradients(self, grads: Any, variables: Any) -> list:
        """All-reduces a list of gradients (None entries pass through) and returns the reduced list."""
        return reduce_gradients(grads, variables, self.options, self._local_set())

    def _local_set(self) -> set[int] | frozenset[int]:
        return self._local_ids() if (self._local_vars or self._local_layers) else frozenset()

    # ------------------------------------------------------------------------------------- serialization
    def get_config(self):
        if self.groups is not None and not isinstance(self.groups, int):
            log.warning("hvdkeras: `groups` given as lists of variables is not saved with the optimizer")
        return {"name": self.name, "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
                **self.options.to_config()}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        op = config.pop("op", "Average")
        config["op"] = OPS_BY_NAME[op] if isinstance(op, str) else op
        return cls(inner, **config)


# What help() and inspect show for `DistributedOptimizer(...)`: the constructor's parameters, not the factory's.
_init = inspect.signature(DistributedOptimizer.__init__)
DistributedOptimizer.__signature__ = _init.replace(parameters=list(_init.parameters.values())[1:])


# Horovod's PartialDistributedOptimizer parameters: DistributedOptimizer's, less those it does not take,
# with `local_layers` before `scale_local_gradients`, as in horovod.keras.
def _partial_signature() -> inspect.Signature:
    params = dict(inspect.signature(DistributedOptimizer.__init__).parameters)
    for name in ("self", "backward_passes_per_step", "average_aggregated_gradients", "num_groups"):
        del params[name]
    ordered = list(params.values())
    at = [p.name for p in ordered].index("scale_local_gradients")
    local = inspect.Parameter("local_layers", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
    return inspect.Signature([*ordered[:at], local, *ordered[at:]], return_annotation=DistributedOptimizer)


_PARTIAL_SIGNATURE = _partial_signature()


def PartialDistributedOptimizer(*args: Any, **kwargs: Any) -> DistributedOptimizer:  # noqa: N802 - Horovod's name
    """A DistributedOptimizer whose `local_layers` keep their own weights on each worker (Horovod's).

    The gradients of the local layers' trainable weights are not reduced; everything else is averaged as
    usual. Pass the same variables to `BroadcastGlobalVariablesCallback(local_variables=...)` so the
    broadcast leaves them too. The parameters are Horovod's, in its order: DistributedOptimizer's, less
    `backward_passes_per_step`, `average_aggregated_gradients` and `num_groups`, with `local_layers`.

    Args:
        local_layers: a keras.layers.Layer or a list of them (None: same as DistributedOptimizer).
        The others: as for `DistributedOptimizer`.

    Raises:
        ValueError: `local_layers` holds something other than Keras layers.

    Example:
        >>> opt = hvdkeras.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[model.layers[-1]])
    """
    arguments = _PARTIAL_SIGNATURE.bind(*args, **kwargs).arguments
    local_layers = arguments.pop("local_layers", None)
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError(f"`local_layers` must be Keras layers. Received: local_layers={local_layers!r}")
    opt = DistributedOptimizer(**arguments)
    opt._local_layers = list(local_layers)
    return opt


PartialDistributedOptimizer.__signature__ = _PARTIAL_SIGNATURE


def install_compile_config() -> None:
    """Makes `keras.Model.get_compile_config` record a DistributedOptimizer as the optimizer it wraps.

    So a model saved from a job (model.save, ModelCheckpoint) loads with plain `keras.models.load_model`
    in a process that never imports hvdkeras: a notebook, an evaluation job, a serving export.
    `hvdkeras.load_model` wraps it again. Installed by `DistributedOptimizer(...)`;
    `patches.uninstall("compile_config")` undoes it.
    """
    if patches.installed("compile_config"):
        return
    keras_get_compile_config = keras.Model.get_compile_config

    def get_compile_config(model):
        config = keras_get_compile_config(model)
        compiled = getattr(model, "_compile_config", None)
        if config and compiled is not None and isinstance(compiled.config.get("optimizer"), DistributedOptimizer):
            config = dict(config)
            plain = unwrap(compiled.config["optimizer"], loss_scale=False)
            config["optimizer"] = keras.saving.serialize_keras_object(plain)
        return config

    patches.install("compile_config", [(keras.Model, "get_compile_config", get_compile_config)])


@keras.saving.register_keras_serializable(package="hvdkeras")
class DistributedLossScaleOptimizer(DistributedOptimizer):
    """A DistributedOptimizer that holds the loss scaling: its inner optimizer is a LossScaleOptimizer (made
    around `optimizer` when it is not one). `DistributedOptimizer(...)` makes it around a LossScaleOptimizer or
    under the mixed_float16 policy.

    The inner LossScaleOptimizer checks the reduced gradients: when any worker's gradients overflow, the
    reduced gradients are non-finite on every worker, and all workers skip the step and lower the scale
    together. `keras.optimizers.LossScaleOptimizer(opt)` of one gives it back (`install_loss_scale_passthrough`),
    so `Model.compile` under mixed_float16, which wraps every optimizer that is not a LossScaleOptimizer, keeps
    it as it is, and the loss is scaled once. The loss-scale properties are the inner LossScaleOptimizer's.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer, *args: Any, **kwargs: Any):
        _check_inner(optimizer)
        if not isinstance(optimizer, LossScaleOptimizer):
            # What compile would do under mixed_float16, but inside: the check must see the reduced gradients.
            log.info("hvdkeras: mixed_float16 policy: wrapping %s in a LossScaleOptimizer", optimizer.name)
            optimizer = LossScaleOptimizer(optimizer)
        super().__init__(optimizer, *args, **kwargs)
        install_loss_scale_passthrough()

    @property
    def dynamic_scale(self):
        return self.inner_optimizer.dynamic_scale

    @property
    def initial_scale(self):
        return self.inner_optimizer.initial_scale

    @property
    def dynamic_growth_steps(self):
        return self.inner_optimizer.dynamic_growth_steps

    @property
    def step_counter(self):
        return self.inner_optimizer.step_counter


def install_loss_scale_passthrough() -> None:
    """Makes `keras.optimizers.LossScaleOptimizer(opt)` give `opt` back when it is a DistributedLossScaleOptimizer,
    which scales its loss already (the "loss_scale_passthrough" patch; `patches.uninstall` undoes it).

    `Model.compile` under the mixed_float16 policy wraps every optimizer that is not a LossScaleOptimizer: it
    then keeps the DistributedLossScaleOptimizer, and the loss is scaled once, with the finiteness check after
    the reduction (as does a script's own `LossScaleOptimizer(hvd.DistributedOptimizer(...))`). Every other
    LossScaleOptimizer is made as before. Installed by the first DistributedLossScaleOptimizer.
    """
    if patches.installed("loss_scale_passthrough"):
        return

    def __new__(cls, inner_optimizer: Any = None, *args: Any, **kwargs: Any):  # noqa: N807 - the class's __new__
        if isinstance(inner_optimizer, DistributedLossScaleOptimizer):
            return inner_optimizer  # not a LossScaleOptimizer: Python runs no __init__ on it
        return object.__new__(cls)

    patches.install("loss_scale_passthrough", [(LossScaleOptimizer, "__new__", staticmethod(__new__))])


def unwrap(optimizer: Any, loss_scale: bool = True) -> Any:
    """The optimizer below every DistributedOptimizer (and, with `loss_scale`, LossScaleOptimizer) layer.

    `unwrap(opt)` is the optimizer that owns the learning rate and the slots; `unwrap(opt, loss_scale=False)`
    is what a DistributedOptimizer wraps, which is what checkpoints record.
    """
    layers = (DistributedOptimizer, LossScaleOptimizer) if loss_scale else DistributedOptimizer
    while isinstance(optimizer, layers):
        optimizer = optimizer.inner_optimizer
    return optimizer
