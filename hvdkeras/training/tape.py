"""DistributedGradientTape: Horovod's TF2 tape, working on Keras 3 variables.

`tape = hvdkeras.DistributedGradientTape(tape)` after the `with tf.GradientTape() as tape:` block makes
`tape.gradient(loss, variables)` return the gradients averaged across the workers, as Horovod's does. Horovod's
own tape calls `.ref()` on every source, which Keras 3 variables do not have (horovod#4290); this one keys them
by `variables.var_id` and reduces through the allreduce reducer (hvdkeras.reduce), as DistributedOptimizer does,
with the same buckets, grouping, compression and local variables.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import compression as _compression
from hvdkeras.reduce import AllreduceReducer, Reducer
from hvdkeras.reduce.context import in_xla_context
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.variables import NamesByIdentity, var_id

# The collectives' names of each list of sources, in the order the process first reduces it: the same on every
# worker (they run the same code), stable from step to step, and distinct for two tapes whose reductions may
# run at the same time (a GAN's generator and discriminator).
_names = NamesByIdentity("hvdkeras.tape")


def _name_for(sources: list) -> str:
    return _names.name_for(list(sources))


class _DistributedGradientTape(tf.GradientTape):
    """A tf.GradientTape whose `gradient` reduces across the workers; everything else is the wrapped tape's.

    Made by `DistributedGradientTape(...)`. It holds the user's tape (of whatever class) and delegates to it,
    so recording, `watch`, `stop_recording`, `reset`, `jacobian` and a persistent tape behave as the user's
    own tape does.
    """

    def __init__(self, tape: tf.GradientTape, options: ReductionOptions, local_layers: list | None = None,
                 reducer: Reducer | None = None):
        # tf.GradientTape.__init__ is not called: this object records nothing itself, the wrapped tape does.
        self._hvd_tape = tape
        self._hvd_options = options
        self._hvd_local_sources: list = []
        self._hvd_local_layers = list(local_layers or [])
        self._hvd_reducer = reducer or AllreduceReducer(options, lambda: self.local_sources)
        if reducer is not None:
            reducer.bind(options, lambda: self.local_sources)

    # ------------------------------------------------------------------------------ the wrapped tape's own
    def __enter__(self):
        self._hvd_tape.__enter__()
        return self

    def __exit__(self, typ, value, traceback):
        return self._hvd_tape.__exit__(typ, value, traceback)

    def watch(self, tensor):
        self._hvd_tape.watch(tensor)

    def stop_recording(self):
        return self._hvd_tape.stop_recording()

    def reset(self):
        self._hvd_tape.reset()

    def watched_variables(self):
        return self._hvd_tape.watched_variables()

    def jacobian(self, *args, **kwargs):
        """The wrapped tape's jacobian, not reduced (as in Horovod)."""
        return self._hvd_tape.jacobian(*args, **kwargs)

    def batch_jacobian(self, *args, **kwargs):
        """The wrapped tape's batch_jacobian, not reduced (as in Horovod)."""
        return self._hvd_tape.batch_jacobian(*args, **kwargs)

    def __getattr__(self, name):
        # Only reached for attributes this object lacks: the wrapped tape's (_persistent, _tape, ...).
        if name.startswith("_hvd_"):
            raise AttributeError(name)
        return getattr(self._hvd_tape, name)

    # ---------------------------------------------------------------------------------------- Horovod's
    def register_local_source(self, source: Any) -> None:
        """Keeps `source`'s gradient on each worker, as Horovod's `register_local_source`: it is not reduced
        (and is divided by the number of workers when `scale_local_gradients`).

        Raises:
            TypeError: `source` is not a variable or tensor.
        """
        if not (isinstance(source, (keras.Variable, tf.Variable)) or tf.is_tensor(source)):
            raise TypeError(
                f"`source` must be a keras.Variable, tf.Variable or tensor. Received: source={source!r} of type "
                f"{type(source).__name__}")
        self._hvd_local_sources.append(source)

    @property
    def local_sources(self) -> set[int]:
        """The `var_id`s of the local sources: those registered and the local layers' trainable weights (read
        when gradients are reduced, since Keras 3 builds layers lazily)."""
        weights = [w for layer in self._hvd_local_layers for w in layer.trainable_weights]
        return {var_id(s) for s in [*self._hvd_local_sources, *weights]}

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The wrapped tape's gradients of `target` with respect to `sources`, reduced across the workers.

        Args:
            target: as for tf.GradientTape.gradient.
            sources: a variable, a tensor, or a nested structure of them (Keras 3 variables included); the
                result has the same structure.
            output_gradients: passed to the wrapped tape.
            unconnected_gradients: passed to the wrapped tape (NONE: unconnected sources get None, which is
                not reduced; ZERO: zeros, which are).

        Raises:
            RuntimeError: called inside an XLA-compiled function (Horovod's collectives cannot be compiled).
        """
        if in_xla_context():
            raise RuntimeError(
                "Horovod's collectives cannot be compiled by XLA, and DistributedGradientTape.gradient is being "
                "traced inside an XLA-compiled function (tf.function(jit_compile=True)). Compute the gradients "
                "in the compiled function with a plain tf.GradientTape, return them, and reduce them outside it: "
                "pass them to an hvdkeras.DistributedOptimizer, or call tf.function(jit_compile=False).")
        grads = self._hvd_tape.gradient(target, sources, output_gradients=output_gradients,
                                        unconnected_gradients=unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads)
        reduced = self._hvd_reducer.reduce(flat_grads, flat_sources, name=_name_for(flat_sources))
        return tf.nest.pack_sequence_as(grads, reduced.grads)


def DistributedGradientTape(  # noqa: N802 - Horovod's name
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = _compression.Compression.none,
    sparse_as_dense: bool = False,
    op: int = C.Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = C.global_process_set,
    scale_local_gradients: bool = True,
    *,
    bucket_bytes: int | None = None,
    reducer: Reducer | str | None = None,
) -> tf.GradientTape:
    """A tape whose `gradient()` averages the gradients across all workers (Horovod's DistributedGradientTape).

    Works on Keras 3 variables and tf.Variables, dense and `tf.IndexedSlices` gradients, eagerly and inside
    `tf.function`. The parameters are Horovod's, in its order and with its defaults; see
    `hvdkeras.DistributedOptimizer` for what each does. The gradients it returns, passed as they are to an
    hvdkeras.DistributedOptimizer, are not reduced again.

    Args:
        gradtape: the `tf.GradientTape` that recorded the computation (wrapped after its `with` block, or
            before it: `with hvdkeras.DistributedGradientTape(tf.GradientTape()) as tape:`).
        device_dense, device_sparse, compression, sparse_as_dense, op, gradient_predivide_factor, num_groups,
        groups, process_set, scale_local_gradients: as for `hvdkeras.DistributedOptimizer`.
        bucket_bytes: keyword only; as for `hvdkeras.DistributedOptimizer` (with `groups=None`, the dense
            gradients are reduced in buckets of about this many bytes, last layers first).
        reducer: keyword only. How the gradients are reduced: None or "allreduce" (the default), or an
            `hvdkeras.reduce.Reducer` whose work ends with the reduction, such as
            `hvdkeras.reduce.PowerSGDReducer`. Make it once and pass the same one to each step's tape: it holds
            the state carried from step to step (`reducer.state()`, for a tf.train.Checkpoint). A tape sees no
            update, so reducers that act after it (local SGD, DiLoCo, the reduce-scatter) are refused: pass
            them to `hvdkeras.DistributedOptimizer`.

    Returns:
        A `tf.GradientTape` (delegating to `gradtape`) with `register_local_source(source)`.

    Raises:
        TypeError: `gradtape` is not a tf.GradientTape, or `reducer` is not a Reducer.
        ValueError: an invalid option, `gradtape` is already a DistributedGradientTape, or `reducer` acts after
            the update (naming it).

    Example:
        >>> with tf.GradientTape() as tape:
        ...     loss = loss_fn(y, model(x, training=True))
        >>> tape = hvdkeras.DistributedGradientTape(tape)
        >>> grads = tape.gradient(loss, model.trainable_variables)
        >>> optimizer.apply_gradients(zip(grads, model.trainable_variables))
    """
    return _make(gradtape, None, device_dense=device_dense, device_sparse=device_sparse, compression=compression,
                 sparse_as_dense=sparse_as_dense, op=op, gradient_predivide_factor=gradient_predivide_factor,
                 num_groups=num_groups, groups=groups, process_set=process_set,
                 scale_local_gradients=scale_local_gradients, bucket_bytes=bucket_bytes, reducer=reducer)


def PartialDistributedGradientTape(  # noqa: N802 - Horovod's name
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = _compression.Compression.none,
    sparse_as_dense: bool = False,
    op: int = C.Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = C.global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
    *,
    bucket_bytes: int | None = None,
    reducer: Reducer | str | None = None,
) -> tf.GradientTape:
    """A DistributedGradientTape whose `local_layers` keep their own weights on each worker (Horovod's).

    The gradients of the local layers' trainable weights are not reduced (divided by the number of workers
    when `scale_local_gradients`); everything else is averaged. The layers' weights are read when gradients
    are taken, so layers Keras has not built yet count too.

    Args:
        local_layers: a keras.layers.Layer or a list of them (None: same as DistributedGradientTape).
        The others: as for `DistributedGradientTape`.

    Raises:
        ValueError: `local_layers` holds something other than Keras layers.
    """
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    if not isinstance(local_layers, (list, tuple)) or not all(
            isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError(f"`local_layers` must be Keras layers. Received: local_layers={local_layers!r}")
    return _make(gradtape, list(local_layers), device_dense=device_dense, device_sparse=device_sparse,
                 compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                 gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups, groups=groups,
                 process_set=process_set, scale_local_gradients=scale_local_gradients, bucket_bytes=bucket_bytes,
                 reducer=reducer)


def _tape_reducer(reducer: Any) -> Reducer | None:
    """The tape's reducer: None for the allreduce (made per tape), or the Reducer given.

    Raises:
        TypeError: neither "allreduce", None nor a Reducer.
        ValueError: a reducer that acts after the update, which a tape does not see.
    """
    if reducer is None or reducer == "allreduce":
        return None
    if not isinstance(reducer, Reducer):
        raise TypeError(f"`reducer` must be None, 'allreduce' or an hvdkeras.reduce.Reducer (such as "
                        f"PowerSGDReducer). Received: reducer={reducer!r}")
    if reducer.updates_after_apply:
        raise ValueError(
            f"DistributedGradientTape cannot use {type(reducer).__name__}: it acts after the optimizer's update "
            "(averaging or gathering the variables), which a tape does not see. Pass it to "
            f"hvdkeras.DistributedOptimizer(..., reducer=...) instead. Received: reducer={reducer!r}")
    return reducer


def _make(gradtape: Any, local_layers: list | None, num_groups: int, groups: Any, reducer: Any = None,
          **options: Any):
    if isinstance(gradtape, _DistributedGradientTape):
        raise ValueError(
            "`gradtape` is already a DistributedGradientTape; wrapping it twice would reduce every gradient "
            f"twice. Received: gradtape={gradtape!r}")
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(
            "`gradtape` must be a tf.GradientTape, for example the `tape` of `with tf.GradientTape() as tape:`. "
            f"Received: gradtape={gradtape!r} of type {type(gradtape).__name__}")
    chosen = _tape_reducer(reducer)
    return _DistributedGradientTape(gradtape, ReductionOptions.from_horovod(num_groups=num_groups, groups=groups,
                                                                            **options), local_layers, chosen)
