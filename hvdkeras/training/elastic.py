"""Elastic training on Keras 3: keep training when workers leave or join, on Horovod's elastic driver.

Horovod's own elastic Keras support relies on Keras 2 internals (`optimizer.variables()`, `var.ref()`,
`backend.get_session()`); this is the same design for Keras 3.

    state = hvdkeras.elastic.KerasState(model, batch=0, epoch=0)

    @hvdkeras.elastic.run
    def train(state):
        for epoch in range(state.epoch, EPOCHS):
            data = hvdkeras.data.shard(dataset).batch(B).skip(state.batch)   # re-split for the live workers
            model.fit(data, epochs=epoch + 1, initial_epoch=epoch, callbacks=state.callbacks())

    train(state)

Launch with `hvdkeras run -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover.sh train.py`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import collectives
from hvdkeras._checks import check_int
from hvdkeras.failures import lost_peer
from hvdkeras.job import lifecycle
from hvdkeras.training.learning_rate import as_float, scale_factor
from hvdkeras.training.optimizer import unwrap

ObjectState, HorovodInternalError, HostsUpdatedInterrupt = C.elastic_types()


class TensorFlowKerasState(ObjectState):
    """A Keras model's and optimizer's variables plus plain values (epoch, batch, ...) that survive an elastic
    reset: Horovod's `horovod.tensorflow.elastic.TensorFlowKerasState`, on Keras 3.

    `commit()` copies the variables to host memory (and checks for host changes); `restore()` puts back the
    last commit after a failure; `sync()` broadcasts everything from rank 0 (a surviving worker) to all,
    including workers that just joined.

    Args:
        model: the Keras model, built.
        optimizer: defaults to `model.optimizer`; built here if Keras has not built it yet.
        backend: Horovod's TensorFlow 1 session backend; unused (Keras 3 runs eagerly), accepted for
            Horovod's signature.
        **kwargs: plain values to track, exposed as attributes (e.g. `epoch=0, batch=0`).

    Raises:
        ValueError: the model is not built yet.

    Example:
        >>> state = hvdkeras.elastic.TensorFlowKerasState(model, epoch=0, batch=0)
    """

    def __init__(self, model: keras.Model, optimizer: Any = None, backend: Any = None, **kwargs: Any):
        if not model.built:
            raise ValueError(f"The model must be built before its elastic state is made, so its variables exist. "
                             f"Received: model {model.name!r} with built=False. Call model.build(input_shape) or "
                             "call the model on a batch first.")
        self.model = model
        self.backend = backend
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(model.trainable_variables)
        self._saved_values: list = []
        self._synced_size: int | None = None  # the world size at the last sync
        super().__init__(bcast_object=C.broadcast_object, get_rank=C.rank, **kwargs)
        # Not gathered here: a worker that joins a running job makes its state while the others wait in sync.
        self._save_variables(gather=False)

    def variables(self) -> list:
        """The model's variables and the optimizer's, less a sharded optimizer's slots (`_saved_optimizer_state`)."""
        own = list(self.model.variables)
        if self.optimizer is None:
            return own
        slots = {id(v) for v in getattr(self.optimizer, "shard_variables", list)()}
        return own + [v for v in self.optimizer.variables if id(v) not in slots]

    def _sharded(self) -> bool:
        return bool(getattr(self.optimizer, "sharded", False))

    def _save_variables(self, gather: bool = True) -> None:
        self._saved_values = [np.array(v.numpy(), copy=True) for v in self.variables()]
        # A sharded optimizer's state, gathered in full (collective: every worker commits together), so that a
        # lost worker's part survives it and a new world can be sharded again from rank 0's copy.
        self._saved_optimizer_state = self.optimizer.gather_state() if gather and self._sharded() else None

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for var, value in zip(self.variables(), self._saved_values):
            var.assign(value)
        super().restore()

    def sync(self) -> None:
        if self._sharded():  # the world may have changed size: shard again, from rank 0's committed state
            self.optimizer.reshard(self._saved_optimizer_state if C.rank() == 0 else None, root_rank=0)
            # The traced step holds the old owners: trace it again.
            self.model.train_function = None
        collectives.broadcast_variables(self.variables(), root_rank=0)
        reducer = getattr(self.optimizer, "reducer", None)
        if reducer is not None and self._synced_size not in (None, C.size()):
            reducer.resized(self._synced_size, C.size())  # each worker's own state (PowerSGD's error feedback)
        self._synced_size = C.size()
        self._save_variables()
        super().sync()


class KerasState(TensorFlowKerasState):
    """`TensorFlowKerasState` whose learning rate follows the world size: after a reset (workers left or
    joined) it is rescaled for the new number of workers.

    Args:
        model: the Keras model (compiled with a DistributedOptimizer), built.
        optimizer: defaults to `model.optimizer`; built here if Keras has not built it yet.
        lr_scaling: the rule the learning rate follows with the world size: "linear", "sqrt" or "none".
        **kwargs: plain values to track, exposed as attributes (e.g. `epoch=0, batch=0`).

    Raises:
        ValueError: the model is not built yet.

    Example:
        >>> state = hvdkeras.elastic.KerasState(model, epoch=0, batch=0)
    """

    def __init__(self, model: keras.Model, optimizer: Any = None, lr_scaling: str = "linear", **kwargs: Any):
        super().__init__(model, optimizer, **kwargs)
        self.lr_scaling = lr_scaling
        self._base_lr = None
        base = unwrap(self.optimizer) if self.optimizer is not None else None
        if base is not None and isinstance(base._learning_rate, keras.Variable):
            self._base_lr = as_float(base.learning_rate) / scale_factor(lr_scaling)

    def reset(self) -> None:
        """After workers left or joined: rescale the learning rate for the new world size."""
        if self._base_lr is not None:
            self.optimizer.learning_rate = self._base_lr * scale_factor(self.lr_scaling)

    def callbacks(self, batches_per_commit: int = 1) -> list:
        """The three callbacks, in the order they must run: batch, epoch, commit."""
        return [UpdateBatchStateCallback(self), UpdateEpochStateCallback(self),
                CommitStateCallback(self, batches_per_commit=batches_per_commit)]


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps `state.batch` at the number of batches finished in the current epoch (resumed epochs included:
    a `fit` that starts at `state.batch` counts on from there)."""

    def __init__(self, state: KerasState):
        super().__init__()
        self.state = state
        self._offset = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._offset = int(self.state.batch)

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = self._offset + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps `state.epoch` at the number of finished epochs."""

    def __init__(self, state: KerasState):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = epoch + 1


class CommitStateCallback(keras.callbacks.Callback):
    """Commits the state every `batches_per_commit` batches and at the end of each epoch.

    A commit also checks whether hosts were added or removed, and raises HostsUpdatedInterrupt on every
    worker at the same batch if so. Place it after the batch and epoch state callbacks.
    """

    def __init__(self, state: KerasState, batches_per_commit: int = 1):
        super().__init__()
        check_int("batches_per_commit", batches_per_commit)
        self.state = state
        self.batches_per_commit = batches_per_commit
        self._since = 0

    def on_train_batch_end(self, batch, logs=None):
        self._since += 1
        if self._since >= self.batches_per_commit:
            self._since = 0
            self.state.commit()

    def on_epoch_end(self, epoch, logs=None):
        self._since = 0
        self.state.commit()


def _is_collective_failure(err: BaseException) -> bool:
    message = str(getattr(err, "message", err))
    # A lost peer, or any error raised inside one of Horovod's ops or hvdkeras's named collectives.
    return lost_peer(message) or "Horovod" in message or "hvdkeras." in message


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Runs `func(state, ...)` under Horovod's elastic driver, so training survives workers leaving/joining.

    On a failed collective (a worker died) every survivor restores the last commit; on a host change every
    worker stops at the same commit. Then Horovod is re-initialized for the new world, `state.reset()`
    rescales the learning rate, `state.sync()` brings every worker (new ones included) to rank 0's state,
    and `func` runs again: write it to continue from `state.epoch` / `state.batch` and to re-shard its data
    for the current `size()` / `rank()`.

    Example:
        >>> @hvdkeras.elastic.run
        ... def train(state): ...
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except (tf.errors.UnknownError, tf.errors.InternalError, tf.errors.AbortedError,
                tf.errors.UnavailableError, tf.errors.FailedPreconditionError) as err:
            if _is_collective_failure(err):
                raise HorovodInternalError(err) from err
            raise

    return C.elastic_run(wrapper, lifecycle.restart_horovod)


__all__ = [
    "CommitStateCallback",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "KerasState",
    "TensorFlowKerasState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]
