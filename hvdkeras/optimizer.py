"""DistributedOptimizer: a Keras 3 optimizer that all-reduces gradients before the inner optimizer applies them.

Keras 3's TensorFlow train step runs `tape.gradient -> optimizer.apply_gradients -> optimizer.apply`, so the
reduction lives in `apply`. The wrapper holds the inner optimizer the way Keras's own LossScaleOptimizer
does; the inner optimizer owns the slots, learning rate, schedule and iteration count.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Sequence

import keras
import tensorflow as tf
from keras.optimizers import LossScaleOptimizer
from tensorflow.python.ops import control_flow_util

from hvdkeras import _collectives as C
from hvdkeras import compression as _compression
from hvdkeras import patches
from hvdkeras._checks import check_int, env_int
from hvdkeras.basics import check_op
from hvdkeras.learning_rate import as_float
from hvdkeras.strategy import check_strategy

log = logging.getLogger("hvdkeras")

_OP_NAMES = dict(C.REDUCE_OPS)
_OPS_BY_NAME = {name: op for op, name in _OP_NAMES.items()}


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


def _check_learning_rate(optimizer: Any) -> None:
    base = unwrap(optimizer)
    lr = getattr(base, "_learning_rate", None)
    if isinstance(lr, keras.Variable):
        value = as_float(lr)
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                "The optimizer's learning rate must be a finite number >= 0. "
                f"Received: learning_rate={value} on {type(base).__name__}"
            )


def _check_groups(groups: Any) -> Any:
    if groups is None:
        return None
    if isinstance(groups, int) and not isinstance(groups, bool):
        return check_int("groups", groups)
    if isinstance(groups, (list, tuple)) and all(isinstance(g, (list, tuple)) for g in groups):
        seen: set[int] = set()
        for group in groups:
            for var in group:
                key = var_id(var)
                if key in seen:
                    raise ValueError(
                        f"`groups` lists a variable more than once. Received: variable={getattr(var, 'path', var)!r}"
                    )
                seen.add(key)
        return [list(g) for g in groups]
    raise ValueError(
        "`groups` must be None, an integer >= 1 or a list of lists of variables. "
        f"Received: groups={groups!r}"
    )


# Gradients are reduced in buckets of about this many bytes, in the order the backward pass produces them, so
# the first buckets travel while the rest of the backward pass still runs. Chosen by measurement on two hosts
# over a shaped link (benchmarks/network_benchmark.py; docs/network.md).
DEFAULT_BUCKET_BYTES = 64 << 10
BUCKET_BYTES_ENV = "HVDKERAS_BUCKET_BYTES"


def default_bucket_bytes(environ: Any = None) -> int:
    """The bucket size when none is passed: $HVDKERAS_BUCKET_BYTES, else DEFAULT_BUCKET_BYTES."""
    return env_int(os.environ if environ is None else environ, BUCKET_BYTES_ENV, DEFAULT_BUCKET_BYTES)


def _nbytes(var: Any) -> int:
    count = 1
    for dim in var.shape:
        count *= int(dim)
    return count * tf.as_dtype(var.dtype).size


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
        filled += _nbytes(variables[i])
        if filled >= bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


def var_id(var: Any) -> int:
    """Identity of a variable, the same for a keras.Variable and the tf.Variable inside it."""
    inner = getattr(var, "value", None)
    return id(inner) if isinstance(inner, tf.Variable) else id(var)


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


@keras.saving.register_keras_serializable(package="hvdkeras")
class DistributedOptimizer(keras.optimizers.Optimizer):
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

    def __new__(cls, optimizer: Any = None, *args: Any, **kwargs: Any):
        # The one class switch: around a LossScaleOptimizer (or under the mixed_float16 policy) the object is a
        # DistributedLossScaleOptimizer, which is also a LossScaleOptimizer, so `compile` does not wrap it
        # again and the finiteness check sees the reduced gradients. Everything else stays this class.
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
    ):
        _check_inner(optimizer)
        check_strategy()
        bucket_bytes = default_bucket_bytes() if bucket_bytes is None else check_int(
            "bucket_bytes", bucket_bytes, 0, unit="bytes",
            hint="(0: one allreduce for all gradients, after the whole backward pass)")
        _check_learning_rate(optimizer)
        compressor = _compression.get(compression)
        check_op(op)
        check_int("backward_passes_per_step", backward_passes_per_step)
        if not isinstance(gradient_predivide_factor, (int, float)) or isinstance(gradient_predivide_factor, bool) \
                or not math.isfinite(gradient_predivide_factor) or gradient_predivide_factor <= 0:
            raise ValueError(
                "`gradient_predivide_factor` must be a finite number > 0. "
                f"Received: gradient_predivide_factor={gradient_predivide_factor!r}"
            )
        if gradient_predivide_factor != 1.0 and op != C.Average:
            raise ValueError(
                "`gradient_predivide_factor` other than 1.0 requires op=hvdkeras.Average. "
                f"Received: op={_OP_NAMES[op]}, gradient_predivide_factor={gradient_predivide_factor}"
            )
        check_int("num_groups", num_groups, 0)
        if num_groups and groups is not None:
            raise ValueError(f"Pass `groups` or the deprecated `num_groups`, not both. Received: num_groups="
                             f"{num_groups}, groups={groups!r}")
        groups = _check_groups(num_groups or groups)
        if not isinstance(process_set, C.ProcessSet):
            raise TypeError(f"`process_set` must be an hvdkeras.ProcessSet. Received: process_set={process_set!r}")
        if isinstance(self, LossScaleOptimizer) and not isinstance(optimizer, LossScaleOptimizer):
            log.info("hvdkeras: mixed_float16 policy: wrapping %s in a LossScaleOptimizer", optimizer.name)
            optimizer = LossScaleOptimizer(optimizer)

        # Not super().__init__: for DistributedLossScaleOptimizer the next class in the MRO is
        # LossScaleOptimizer, whose constructor would wrap the inner optimizer a second time.
        keras.optimizers.Optimizer.__init__(
            self, learning_rate=0.0, name=name or f"distributed_{optimizer.name}"
        )
        self.inner_optimizer = optimizer
        install_compile_config()
        self.compression = compressor
        self.op = op
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = bool(average_aggregated_gradients)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.device_dense = device_dense
        self.device_sparse = device_sparse
        self.process_set = process_set
        self.scale_local_gradients = bool(scale_local_gradients)
        self._groups = groups
        self.bucket_bytes = bucket_bytes
        self._local_vars: list = []
        self._local_layers: list = []
        self._accumulators: list = []
        self._pass_counter = None

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

    # ----------------------------------------------------------------- state delegated to the inner optimizer
    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

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

    def __getattr__(self, name: str):
        # Only reached when normal lookup fails: expose the inner optimizer's hyperparameters
        # (momentum, beta_1, ...) the way users read them on the optimizer they passed in.
        if hasattr(type(self), name):
            # A property of ours raised AttributeError inside: show that error, not the inner optimizer's.
            return object.__getattribute__(self, name)
        inner = self.__dict__.get("inner_optimizer")
        if name.startswith("_") or inner is None or not hasattr(inner, name):
            wrapped = f" (nor has the {type(inner).__name__} it wraps)" if inner is not None else ""
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}{wrapped}")
        return getattr(inner, name)

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
        # Explicit base call, as in __init__: skip LossScaleOptimizer.build for the loss-scale variant.
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

    def reduce_gradients(self, grads: Sequence[Any], variables: Sequence[Any]) -> list:
        """All-reduces a list of gradients (None entries pass through) and returns the reduced list."""
        out = list(grads)
        dense, sparse = [], []
        local = self._local_ids() if (self._local_vars or self._local_layers) else set()
        for i, g in enumerate(out):
            if g is None:
                continue
            if local and var_id(variables[i]) in local:
                if self.scale_local_gradients:
                    out[i] = self._scale_local(g)
                continue
            if isinstance(g, tf.IndexedSlices):
                if self.sparse_as_dense:
                    out[i] = tf.convert_to_tensor(g)
                    dense.append(i)
                else:
                    sparse.append(i)
            else:
                dense.append(i)
        for k, group in enumerate(self._dense_groups(dense, variables)):
            self._reduce_dense(out, group, name=f"hvdkeras.gradients.{k}")
        for i in sparse:
            out[i] = self._reduce_sparse(out[i], name=f"hvdkeras.gradients.sparse.{i}")
        return out

    def _dense_groups(self, dense: list[int], variables: Sequence[Any]) -> list[list[int]]:
        if self._groups is None:
            groups = gradient_buckets(dense, variables, self.bucket_bytes)
        elif isinstance(self._groups, int):
            n = min(self._groups, len(dense)) or 1
            step, extra = divmod(len(dense), n)
            groups, start = [], 0
            for k in range(n):
                end = start + step + (1 if k < extra else 0)
                groups.append(dense[start:end])
                start = end
        else:
            where = {}
            for gi, group in enumerate(self._groups):
                for var in group:
                    where[var_id(var)] = gi
            by_group: dict[int, list[int]] = {}
            singles = []
            for i in dense:
                gi = where.get(var_id(variables[i]))
                if gi is None:
                    singles.append([i])
                else:
                    by_group.setdefault(gi, []).append(i)
            groups = [by_group[k] for k in sorted(by_group)] + singles
        # Horovod fuses only tensors of one dtype per grouped call: split each group by dtype.
        split = []
        for group in groups:
            by_dtype: dict[Any, list[int]] = {}
            for i in group:
                by_dtype.setdefault(variables[i].dtype, []).append(i)
            split.extend(by_dtype.values())
        return [g for g in split if g]

    def _scale_local(self, grad):
        size = tf.cast(C.size_tensor(self.process_set), grad.dtype)
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(grad.values / size, grad.indices, dense_shape=grad.dense_shape)
        return grad / size

    def _scale_factors(self) -> tuple[float, float]:
        if self.op == C.Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _reduce_dense(self, out: list, indices: list[int], name: str) -> None:
        sent, ctxs = [], []
        for i in indices:
            t, ctx = self.compression.compress(tf.convert_to_tensor(out[i]))
            sent.append(t)
            ctxs.append(ctx)
        pre, post = self._scale_factors()
        with tf.device(self.device_dense):
            reduced = C.grouped_allreduce(sent, op=self.op, prescale_factor=pre, postscale_factor=post, name=name,
                                          process_set=self.process_set)
        for i, t, ctx in zip(indices, reduced, ctxs):
            out[i] = self.compression.decompress(t, ctx)

    def _reduce_sparse(self, grad: tf.IndexedSlices, name: str) -> tf.IndexedSlices:
        with tf.device(self.device_sparse):
            values = C.allgather(grad.values, name=f"{name}.values", process_set=self.process_set)
            indices = C.allgather(grad.indices, name=f"{name}.indices", process_set=self.process_set)
        if self.op == C.Average:
            values = values / tf.cast(C.size_tensor(self.process_set), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=grad.dense_shape)

    # ------------------------------------------------------------------------------------- serialization
    def get_config(self):
        if self._groups is not None and not isinstance(self._groups, int):
            log.warning("hvdkeras: `groups` given as lists of variables is not saved with the optimizer")
        return {
            "name": self.name,
            "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "compression": _compression.name_of(self.compression),
            "op": _OP_NAMES[self.op],
            "backward_passes_per_step": self.backward_passes_per_step,
            "average_aggregated_gradients": self.average_aggregated_gradients,
            "sparse_as_dense": self.sparse_as_dense,
            "gradient_predivide_factor": self.gradient_predivide_factor,
            "groups": self._groups if isinstance(self._groups, int) else None,
            "bucket_bytes": self.bucket_bytes,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        op = config.pop("op", "Average")
        config["op"] = _OPS_BY_NAME[op] if isinstance(op, str) else op
        return cls(inner, **config)


def PartialDistributedOptimizer(  # noqa: N802 - Horovod's name for this factory
    optimizer: keras.optimizers.Optimizer,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = _compression.Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = C.Average,
    groups: Any = None,
    process_set: Any = C.global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
    bucket_bytes: int | None = None,
) -> DistributedOptimizer:
    """A DistributedOptimizer whose `local_layers` keep their own weights on each worker (Horovod's).

    The gradients of the local layers' trainable weights are not reduced; everything else is averaged as
    usual. Pass the same variables to `BroadcastGlobalVariablesCallback(local_variables=...)` so the
    broadcast leaves them too.

    Args:
        local_layers: a keras.layers.Layer or a list of them (None: same as DistributedOptimizer).
        The others: as for `DistributedOptimizer`.

    Raises:
        ValueError: `local_layers` holds something other than Keras layers.

    Example:
        >>> opt = hvdkeras.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[model.layers[-1]])
    """
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError(f"`local_layers` must be Keras layers. Received: local_layers={local_layers!r}")
    opt = DistributedOptimizer(optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
                               compression=compression, sparse_as_dense=sparse_as_dense,
                               gradient_predivide_factor=gradient_predivide_factor, op=op, groups=groups,
                               process_set=process_set, scale_local_gradients=scale_local_gradients,
                               bucket_bytes=bucket_bytes)
    opt._local_layers = list(local_layers)
    return opt


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


def held_optimizers(model: Any) -> dict[str, Any]:
    """The optimizers a model holds, by attribute: `optimizer` (what `compile` got) first, then any other
    attribute holding one, such as a GAN's `d_optimizer` and `g_optimizer` that its own `compile` keeps."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    candidates = [("optimizer", getattr(model, "optimizer", None)), *sorted(vars(model).items(), key=lambda kv: kv[0])]
    for name, value in candidates:
        if isinstance(value, keras.optimizers.Optimizer) and id(value) not in seen:
            seen.add(id(value))
            found[name] = value
    return found


_xla_warned = False


def ensure_not_jit_compiled(model: Any) -> bool:
    """Turns XLA off for a model with a distributed optimizer; Horovod's ops cannot be XLA-compiled.

    Call before the model's train function is made (callbacks do it in `set_model`). Warns once.

    Returns:
        True when XLA was turned off.
    """
    global _xla_warned
    if not any(isinstance(o, DistributedOptimizer) for o in held_optimizers(model).values()):
        return False
    if not getattr(model, "jit_compile", False):
        return False
    model.jit_compile = False
    for attr in ("train_function", "test_function", "predict_function"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)
    if not _xla_warned:
        _xla_warned = True
        log.warning(
            "hvdkeras: XLA (jit_compile) turned off for model %r: Horovod's collectives cannot be "
            "compiled by XLA. Compile with jit_compile=False to silence this warning.",
            getattr(model, "name", model),
        )
    return True
