"""Callbacks that act on rank 0 only, so no two processes ever write the same file."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import uuid
from typing import Any

import keras

from hvdkeras import _collectives as C
from hvdkeras.training import rank_zero, saving
from hvdkeras.training.models import collective_optimizers, consolidate_optimizer_state

from ._base import HvdCallback
from .broadcast import broadcast_model

_HOOKS = [
    name
    for name in dir(keras.callbacks.Callback)
    if name.startswith("on_")
]


def _alone_on_rank_zero(fn, *args, **kwargs):
    """Calls `fn` on rank 0 only, marked solo: the other ranks are not there to wait with it."""
    if not rank_zero.is_rank_zero():
        return None
    with rank_zero.solo():
        return fn(*args, **kwargs)


# After these hooks a file written by rank 0 may be read by anyone: with `wait`, everyone waits for it.
_WAIT_HOOKS = {"on_epoch_end", "on_train_end"}


class RankZeroOnly(HvdCallback):
    """Runs another callback's hooks on rank 0 only (build it with `rank_zero_only`).

    Args:
        callback: the Keras callback.
        wait: after `on_epoch_end` and `on_train_end`, every rank waits until rank 0 has finished the hook
            (so a file it wrote is there for all); collective, so every rank must have this callback.
    """

    def __init__(self, callback: keras.callbacks.Callback, wait: bool = False):
        super().__init__()
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError(
                f"`callback` must be a keras.callbacks.Callback instance. Received: callback={callback!r}"
            )
        self.callback = callback
        self.wait = wait

    def set_model(self, model):
        super().set_model(model)
        self.callback.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        self.callback.set_params(params)


def _forward(name):
    def hook(self, *args, **kwargs):
        result = _alone_on_rank_zero(getattr(self.callback, name), *args, **kwargs)
        if self.wait and name in _WAIT_HOOKS:
            rank_zero.barrier()
        return result

    hook.__name__ = name
    return hook


for _name in _HOOKS:
    setattr(RankZeroOnly, _name, _forward(_name))


def rank_zero_only(callback: keras.callbacks.Callback, wait: bool = False) -> RankZeroOnly:
    """Makes any Keras callback act on rank 0 only (see `RankZeroOnly` for `wait`).

    Example:
        >>> cb = hvdkeras.callbacks.rank_zero_only(keras.callbacks.ModelCheckpoint("ckpt-{epoch:02d}.keras"))
    """
    return RankZeroOnly(callback, wait=wait)


class _RankZeroHooks:
    """Mixin: every `on_*` hook of the Keras callback it is mixed into runs on rank 0 only."""


for _name in _HOOKS:

    def _gated(self, *args, _name=_name, **kwargs):
        return _alone_on_rank_zero(getattr(super(_RankZeroHooks, self), _name), *args, **kwargs)

    _gated.__name__ = _name
    setattr(_RankZeroHooks, _name, _gated)


# The hooks in which Keras's ModelCheckpoint counts batches and epochs and may save.
_CHECKPOINT_HOOKS = ("on_epoch_begin", "on_epoch_end", "on_train_batch_end")


class ModelCheckpoint(_RankZeroHooks, keras.callbacks.ModelCheckpoint):
    """`keras.callbacks.ModelCheckpoint` that saves on rank 0 only (same arguments).

    Each file is written under a temporary name and renamed when complete: a crash during a save never
    leaves a truncated checkpoint under the final name. With a sharded optimizer (shard_optimizer_state=True), or
    a reducer with state of each worker's own (PowerSGD's error feedback), every worker runs the hooks that may
    save, and gathers the optimizer's state with the others before rank 0 writes it; so every worker must have
    this callback.
    """

    def _save_model(self, epoch, batch, logs):
        if rank_zero.in_solo():
            with saving.atomic_model_writes(self.model):
                return super()._save_model(epoch, batch, logs)
        consolidate_optimizer_state(self.model)
        return _alone_on_rank_zero(self._save_model, epoch, batch, logs)


def _on_every_rank_when_collective(name):
    gated = getattr(_RankZeroHooks, name)

    def hook(self, *args, **kwargs):
        if collective_optimizers(self.model):
            return getattr(keras.callbacks.ModelCheckpoint, name)(self, *args, **kwargs)
        return gated(self, *args, **kwargs)

    hook.__name__ = name
    return hook


for _name in _CHECKPOINT_HOOKS:
    setattr(ModelCheckpoint, _name, _on_every_rank_when_collective(_name))


class BestModelCheckpoint(ModelCheckpoint):
    """Horovod's BestModelCheckpoint: keeps only the best model so far (`save_best_only=True`), on rank 0.

    Horovod's estimators set `filepath` after creating it; here give it as the last argument or set the
    attribute before `fit`.

    Raises:
        ValueError: `fit` starts while `filepath` is still None.

    Example:
        >>> BestModelCheckpoint(monitor="val_loss", filepath="best.keras")
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, save_weights_only: bool = False,
                 mode: str = "auto", save_freq: Any = "epoch", filepath: str | None = None):
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath or placeholder, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        self.filepath = None if filepath is None else self.filepath

    def on_train_begin(self, logs=None):
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint needs a file to write: pass filepath= or set .filepath before "
                             "fit. Received: filepath=None")
        super().on_train_begin(logs)


class TensorBoard(_RankZeroHooks, keras.callbacks.TensorBoard):
    """`keras.callbacks.TensorBoard` that writes logs on rank 0 only (same arguments)."""


class CSVLogger(_RankZeroHooks, keras.callbacks.CSVLogger):
    """`keras.callbacks.CSVLogger` that writes on rank 0 only (same arguments)."""


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` for data-parallel jobs (same arguments).

    Rank 0 restores the backup and its epoch; every rank then takes rank 0's weights, optimizer state and
    epoch, so all ranks resume identically without reading the backup themselves. Only rank 0 writes.

    A backup is Keras's two files, the weights and the epoch, and a crash must never leave one of a backup and
    the other of the one before (a resume would then train an epoch twice). So a backup is committed in one
    step: the weights are written in full under a pending name, then the epoch file, naming them, replaces the
    old one (the commit), then the weights take their place. A restore finds a commit that a crash cut short
    by the pending weights its epoch file names, and finishes it; pending weights no epoch file names are
    removed. Every file is written under a temporary name and renamed, so none is ever truncated.
    """

    PENDING = "hvdkeras-pending-"

    def on_train_begin(self, logs=None):
        if rank_zero.is_rank_zero():
            self._finish_commit()
            with rank_zero.solo():
                super().on_train_begin(logs)
        if C.is_initialized() and C.size() > 1:
            epoch = C.broadcast_object(getattr(self.model, "_initial_epoch", None), root_rank=0)
            self.model._initial_epoch = epoch
            broadcast_model(self.model, 0)
            for optimizer in collective_optimizers(self.model).values():  # each worker's part of the restored state
                optimizer.share_loaded_state(0)

    def on_epoch_end(self, epoch, logs=None):
        self._current_epoch = epoch + 1
        self._last_batch_seen = 0
        if self.save_freq == "epoch":
            self._save_model()

    def _save_model(self):
        consolidate_optimizer_state(self.model)
        _alone_on_rank_zero(self._write_backup)

    def _write_backup(self):
        os.makedirs(self.backup_dir, exist_ok=True)
        pending = os.path.join(self.backup_dir, f".{self.PENDING}{uuid.uuid4().hex}.weights.h5")
        with saving.atomic_path(pending) as tmp:
            self.model.save_weights(tmp, overwrite=True)
        with saving.atomic_path(self._training_metadata_path) as tmp:  # the commit
            with open(tmp, "w") as f:
                json.dump({"epoch": self._current_epoch, "batch": self._last_batch_seen,
                           "pending_weights": os.path.basename(pending)}, f)
        os.replace(pending, self._weights_path)

    def _finish_commit(self):
        """Puts in place the weights of a backup whose commit a crash cut short, and removes the weights of one
        that was never committed."""
        named = None
        try:
            with open(self._training_metadata_path) as f:
                named = json.load(f).get("pending_weights")
        except (OSError, ValueError, AttributeError):
            pass
        if named and os.path.exists(os.path.join(self.backup_dir, named)):
            os.replace(os.path.join(self.backup_dir, named), self._weights_path)
        for stale in glob.glob(os.path.join(glob.escape(self.backup_dir), f".*{self.PENDING}*")):
            with contextlib.suppress(OSError):
                os.unlink(stale)

    def on_train_end(self, logs=None):
        # Everyone is past the last epoch before rank 0 removes the backup.
        rank_zero.barrier()
        if rank_zero.is_rank_zero():
            super().on_train_end(logs)
