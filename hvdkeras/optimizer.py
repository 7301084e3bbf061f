"""DistributedOptimizer: a Keras 3 optimizer that all-reduces gradients before the inner optimizer applies them.

Keras 3's TensorFlow train step runs `tape.gradient -> optimizer.apply_gradients -> optimizer.apply`, so the
reduction happens in `apply` (hvdkeras.reduction does it). The wrapper holds the inner optimizer the way
Keras's own LossScaleOptimizer does: the inner optimizer owns the slots, learning rate, schedule and
iteration count, and the wrapper's properties read them there.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from typing import Any

import keras
import tensorflow as tf
from keras.optimizers import LossScaleOptimizer
from tensorflow.python.ops import control_flow_util

from hvdkeras import _collectives as C
from hvdkeras import compression as _compression
from hvdkeras import patches, reduction
from hvdkeras._checks import check_number
from hvdkeras.learning_rate import as_float
from hvdkeras.reduction import ReductionOptions
from hvdkeras.strategy import check_strategy
from hvdkeras.variables import var_id

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


def _in_xla_context() -> bool:
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _wants_loss_scaling(optimizer: Any) -> bool:
    if isinstance(optimizer, LossScaleOptimizer):
        return True
    return (
        isinstance(optimizer, keras.optimizers.Optimizer)
        and not isinstance(optimizer, DistributedOptimizer)
        and keras.mixed_precision.global_policy().name == "mixed_float16"
    )


class _Factory(type):
    """`DistributedOptimizer(...)` is a factory: around a LossScaleOptimizer, or under the mixed_float16 policy,
    it makes a DistributedLossScaleOptimizer (a LossScaleOptimizer too, so `compile` does not wrap it again and
    the finiteness check sees the reduced gradients); otherwise a DistributedOptimizer."""

    def __call__(cls, optimizer: Any = None, *args: Any, **kwargs: Any):
        if cls is DistributedOptimizer and _wants_loss_scaling(optimizer):
            cls = DistributedLossScaleOptimizer
        return super().__call__(optimizer, *args, **kwargs)


def _option(name: str) -> property:
    return property(lambda self: getattr(self.options, name), doc=f"`options.{name}` (read-only).")


def _inner(name: str) -> property:
    def get(self):
        return getattr(self.inner_optimizer, name)

    def set_(self, value):
        setattr(self.inner_optimizer, name, value)

    return property(get, set_, doc=f"The inner optimizer's `{name}`.")


def _inner_hyperparameters() -> tuple[str, ...]:
    """The hyperparameters of Keras's own optimizers (momentum, beta_1, rho, ...): the constructor parameters
    of each keras.optimizers class beyond the base optimizer's, which the wrapper reads on its inner one."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    own = set(inspect.signature(BaseOptimizer.__init__).parameters)
    own |= set(inspect.signature(LossScaleOptimizer.__init__).parameters) | {"optimizer_map"}
    names: set[str] = set()
    for value in vars(keras.optimizers).values():
        if isinstance(value, type) and issubclass(value, keras.optimizers.Optimizer):
            names |= set(inspect.signature(value.__init__).parameters) - own
    return tuple(sorted(names))


INNER_HYPERPARAMETERS = _inner_hyperparameters()


@keras.saving.register_keras_serializable(package="hvdkeras")
class DistributedOptimizer(keras.optimizers.Optimizer, metaclass=_Factory):
    """Wraps a Keras 3 optimizer so gradients are averaged across all workers before every update.

    Each worker computes gradients on its own shard of the global batch; `apply` all-reduces them (dense
    gradients in buckets of `bucket_bytes`, one fused allreduce per bucket and dtype, in the order the
    backward pass produces them, so communication overlaps the rest of the backward pass; sparse ones are
    allgathered) and hands the result to the inner optimizer, so all model copies stay identical and N
    workers train like one worker on N times the batch.

    Mixed precision: when `optimizer` is a `LossScaleOptimizer`, or the global dtype policy is
    `mixed_float16` (in which case the optimizer is wrapped in a `LossScaleOptimizer` here, as `compile`
    would), the result is a `DistributedLossScaleOptimizer`: it is a `LossScaleOptimizer`, so `compile` does
    not wrap it again, and the finiteness check runs on the reduced gradients, so all workers skip an
    overflowing step together. Create the optimizer after setting the policy.

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

    The parameters up to `scale_local_gradients` are Horovod's, in Horovod's order and with its defaults.

    Raises:
        TypeError: `optimizer` is not a Keras 3 optimizer instance.
        ValueError: an invalid option, or `optimizer` is already distributed.

    Example:
        >>> opt = hvdkeras.DistributedOptimizer(keras.optimizers.Adam(hvdkeras.scale_learning_rate(1e-3)))
        >>> model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    """

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
    ):
        _check_inner(optimizer)
        check_strategy()
        options = ReductionOptions.from_horovod(
            num_groups=num_groups, groups=groups, device_dense=device_dense, device_sparse=device_sparse,
            compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
            scale_local_gradients=scale_local_gradients, bucket_bytes=bucket_bytes)
        if isinstance(self, LossScaleOptimizer) and not isinstance(optimizer, LossScaleOptimizer):
            log.info("hvdkeras: mixed_float16 policy: wrapping %s in a LossScaleOptimizer", optimizer.name)
            optimizer = LossScaleOptimizer(optimizer)
        # The base optimizer's constructor, named: for DistributedLossScaleOptimizer the next class in the MRO
        # is LossScaleOptimizer, whose constructor would wrap the inner optimizer a second time.
        keras.optimizers.Optimizer.__init__(self, learning_rate=0.0, name=name or f"distributed_{optimizer.name}")
        self.inner_optimizer = optimizer
        self.options = options
        install_compile_config()
        self._local_vars: list = []
        self._local_layers: list = []
        self._accumulators: list = []
        self._pass_counter = None

    # ----------------------------------------------------------------- state held by the inner optimizer
    learning_rate = _inner("learning_rate")
    iterations = property(lambda self: self.inner_optimizer.iterations,
                          doc="The inner optimizer's iteration count.")

    @property
    def variables(self):
        """The inner optimizer's variables, then (only with backward_passes_per_step > 1) the accumulators."""
        extra = [self._pass_counter, *self._accumulators] if self._pass_counter is not None else []
        return self.inner_optimizer.variables + extra

    def save_own_variables(self, store):
        # Only the inner optimizer's state: the file is what a plain Keras optimizer saves and loads.
        # The accumulators are empty at every update (where checkpoints are taken) and start empty.
        self.inner_optimizer.save_own_variables(store)

    def load_own_variables(self, store):
        self.inner_optimizer.load_own_variables(store)

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

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
        if not self.inner_optimizer.built:  # e.g. restored by load_model, then wrapped
            self.inner_optimizer.build(var_list)
        # The base optimizer's build, named, as in __init__: not LossScaleOptimizer.build for the loss-scale variant.
        keras.optimizers.Optimizer.build(self, var_list)

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
        if _in_xla_context():
            raise RuntimeError(
                "Horovod's collectives cannot be compiled by XLA, and this optimizer is being traced inside "
                "an XLA-compiled function. Pass an hvdkeras callback (BroadcastGlobalVariablesCallback, "
                "MetricAverageCallback, ...) to fit, which turns XLA off for the model with a warning, or "
                "compile the model with jit_compile=False, or keep DistributedOptimizer.apply outside "
                "tf.function(jit_compile=True)."
            )
        if self.backward_passes_per_step == 1:
            self.inner_optimizer.apply(self.reduce_gradients(grads, trainable_variables), trainable_variables)
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
            self.inner_optimizer.apply(self.reduce_gradients(total, trainable_variables), trainable_variables)
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

    def reduce_gradients(self, grads: Any, variables: Any) -> list:
        """All-reduces a list of gradients (None entries pass through) and returns the reduced list."""
        local = self._local_ids() if (self._local_vars or self._local_layers) else frozenset()
        return reduction.reduce_gradients(grads, variables, self.options, local)

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
        config["op"] = reduction.OPS_BY_NAME[op] if isinstance(op, str) else op
        return cls(inner, **config)


# Each ReductionOptions field (compression, op, bucket_bytes, ...) read-only on the optimizer, and momentum, beta_1,
# rho, ... read (and set) on the optimizer the user passed in.
for _name, _property in [*((f.name, _option(f.name)) for f in dataclasses.fields(ReductionOptions)),
                         *((n, _inner(n)) for n in INNER_HYPERPARAMETERS)]:
    if hasattr(DistributedOptimizer, _name):
        raise RuntimeError(f"{_name!r} would hide an attribute DistributedOptimizer already has")
    setattr(DistributedOptimizer, _name, _property)
del _name, _property

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
class DistributedLossScaleOptimizer(DistributedOptimizer, LossScaleOptimizer):
    """A DistributedOptimizer around a LossScaleOptimizer (built by `DistributedOptimizer(...)`).

    It is a `LossScaleOptimizer`, so `Model.compile` under `mixed_float16` keeps it as it is, and the inner
    LossScaleOptimizer checks the all-reduced gradients: when any worker's gradients overflow, the reduced
    gradients are non-finite on every worker and all workers skip the step and lower the scale together.
    """

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


def unwrap(optimizer: Any, loss_scale: bool = True) -> Any:
    """The optimizer below every DistributedOptimizer (and, with `loss_scale`, LossScaleOptimizer) layer.

    `unwrap(opt)` is the optimizer that owns the learning rate and the slots; `unwrap(opt, loss_scale=False)`
    is what a DistributedOptimizer wraps, which is what checkpoints record.
    """
    layers = (DistributedOptimizer, LossScaleOptimizer) if loss_scale else DistributedOptimizer
    while isinstance(optimizer, layers):
        optimizer = optimizer.inner_optimizer
    return optimizer
