"""The callbacks the wrap gives fit: the script's writers on rank 0, the moving statistics averaged, the
learning rate's warm-up."""

from __future__ import annotations

import math
from typing import Any

import keras

from hvdkeras import callbacks as hvd_callbacks
from hvdkeras.training import sync_batch_norm
from hvdkeras.training.models import held_optimizers
from hvdkeras.training.optimizer import DistributedOptimizer
from hvdkeras.wrap.state import warn_once


def shards_state(model: Any) -> bool:
    return any(isinstance(o, DistributedOptimizer) and o.shard_optimizer_state for o in held_optimizers(model).values())


def as_hvd_checkpoint(cb: keras.callbacks.ModelCheckpoint) -> hvd_callbacks.ModelCheckpoint:
    """The script's ModelCheckpoint, configured as it is, as hvdkeras's: every worker runs its hooks and
    gathers a sharded optimizer's state with the others before rank 0 saves."""
    converted = hvd_callbacks.ModelCheckpoint.__new__(hvd_callbacks.ModelCheckpoint)
    converted.__dict__.update(cb.__dict__)
    return converted


def rank_zero_callbacks(callbacks: list, sharded: bool = False) -> list:
    out = []
    for cb in callbacks:
        if isinstance(cb, (hvd_callbacks.RankZeroOnly, hvd_callbacks.ModelCheckpoint, hvd_callbacks.TensorBoard,
                           hvd_callbacks.CSVLogger, hvd_callbacks.BackupAndRestore)):
            out.append(cb)
        elif isinstance(cb, keras.callbacks.BackupAndRestore):
            out.append(as_hvd_backup(cb))
        elif sharded and isinstance(cb, keras.callbacks.ModelCheckpoint):
            out.append(as_hvd_checkpoint(cb))
        elif isinstance(cb, (keras.callbacks.ModelCheckpoint, keras.callbacks.TensorBoard, keras.callbacks.CSVLogger)):
            out.append(hvd_callbacks.RankZeroOnly(cb, wait=True))
        else:
            out.append(cb)
    return out


def as_hvd_backup(cb: keras.callbacks.BackupAndRestore) -> hvd_callbacks.BackupAndRestore:
    return hvd_callbacks.BackupAndRestore(cb.backup_dir, save_freq=cb.save_freq,
                                          double_checkpoint=cb.double_checkpoint,
                                          delete_checkpoint=cb.delete_checkpoint)


class MovingStatistics(keras.callbacks.Callback):
    """Averages BatchNormalization's moving statistics across workers before each validation and at the
    end of each epoch, so validation, checkpoints and the saved model use one model's statistics."""

    def on_test_begin(self, logs=None):
        sync_batch_norm.average_moving_statistics(self.model)

    def on_epoch_end(self, epoch, logs=None):
        sync_batch_norm.average_moving_statistics(self.model)


class Warmup(hvd_callbacks.LearningRateWarmupCallback):
    """The warm-up of a learning rate that hvdkeras scaled, which hands the rate over to the script as soon as
    the script sets it (its own callback, LearningRateScheduler, ReduceLROnPlateau, ...).

    The rate is compared, before every batch, with the last value hvdkeras saw or set: a change it did not
    make is the script's. From then on hvdkeras stops warming up (in this and later fits) and the rate is
    whatever the script sets; a warning says so once.
    """

    def __init__(self, target: float, warmup_epochs: float):
        super().__init__(target, warmup_epochs=warmup_epochs)
        self._seen: float | None = None
        self.handed_over = False

    def _script_set_it(self) -> bool:
        if not self.handed_over and self._seen is not None and self._current_lr() != self._seen:
            self.handed_over = True
            self.model._hvdkeras_warmup_lr = None
            warn_once("lr-script", f"the script sets the learning rate itself (to {self._current_lr():g}): from "
                                    "now on hvdkeras neither scales nor warms it up, and the rates the script sets "
                                    "are used as they are")
        return self.handed_over

    def _set_lr(self, lr: float) -> None:
        if not self._script_set_it():
            super()._set_lr(lr)
            self._seen = self._current_lr()

    def on_train_begin(self, logs=None):
        self._seen = self._current_lr()

    def on_train_batch_begin(self, batch, logs=None):
        if not self._script_set_it():
            super().on_train_batch_begin(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, None)  # the script's History gets no key of ours
        if epoch >= math.ceil(self.warmup_epochs) - 1:
            self.model._hvdkeras_warmup_lr = None  # warmed up once; later fits start at the scaled rate
