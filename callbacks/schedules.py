"""Learning-rate warm-up and schedules for data-parallel training (Goyal et al. 2017)."""

from __future__ import annotations

import math
from typing import Callable

import keras

from hvdkeras import _collectives as C
from hvdkeras._checks import check_int, check_number
from hvdkeras.training import rank_zero
from hvdkeras.training.learning_rate import as_float, check_learning_rate
from hvdkeras.training.optimizer import unwrap

from ._base import HvdCallback


def _momentum_slots(optimizer) -> list:
    """Slots whose update includes the learning rate (SGD and RMSprop with momentum)."""
    inner = unwrap(optimizer)
    if not getattr(inner, "momentum", 0):
        return []
    return list(getattr(inner, "momentums", None) or getattr(inner, "_momentums", None) or [])


class LearningRateScheduleCallback(HvdCallback):
    """Sets the learning rate to `initial_lr * multiplier(epoch)` for epochs in [start_epoch, end_epoch).

    Args:
        initial_lr: the base learning rate (usually already scaled with `hvdkeras.scale_learning_rate`).
        multiplier: a constant, or a function of the epoch (fractional when `staircase=False`).
        start_epoch: first epoch the schedule applies to.
        end_epoch: epoch at which it stops applying (None: never).
        staircase: change the rate at epoch boundaries only; otherwise every batch, with a fractional epoch.
        momentum_correction: when the rate changes from lr_old to lr_new, scale the momentum of SGD /
            RMSprop (whose momentum carries the learning rate) by lr_new / lr_old (Goyal et al. 2017).
        steps_per_epoch: batches per epoch; defaults to what `fit` knows.

    Raises:
        ValueError: a negative or non-finite initial_lr, negative epochs, end_epoch <= start_epoch.

    Example:
        >>> LearningRateScheduleCallback(0.1 * hvd.size(), multiplier=lambda e: 0.1 ** (e // 30))
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
    ):
        super().__init__()
        self.initial_lr = check_learning_rate("initial_lr", initial_lr)
        if not callable(multiplier):
            check_learning_rate("multiplier", multiplier)
        _check_epoch("start_epoch", start_epoch)
        if end_epoch is not None:
            _check_epoch("end_epoch", end_epoch)
            if end_epoch <= start_epoch:
                raise ValueError(
                    "`end_epoch` must be greater than `start_epoch`. "
                    f"Received: start_epoch={start_epoch}, end_epoch={end_epoch}"
                )
        check_int("steps_per_epoch", steps_per_epoch, allow_none=True)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch, m=float(multiplier): m)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self._epoch = 0

    def _steps(self):
        return self.steps_per_epoch or (self.params or {}).get("steps")

    def _active(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _current_lr(self) -> float:
        return as_float(self.model.optimizer.learning_rate)

    def _set_lr(self, lr: float) -> None:
        optimizer = self.model.optimizer
        if isinstance(unwrap(optimizer)._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                f"{type(self).__name__} sets the learning rate, but the optimizer uses a "
                "LearningRateSchedule. Use a float learning rate, or scale the schedule with "
                "hvdkeras.scale_learning_rate instead."
            )
        old = self._current_lr()
        if self.momentum_correction and old > 0 and lr != old:
            for slot in _momentum_slots(optimizer):
                slot.assign(slot * (lr / old))
        optimizer.learning_rate = lr

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self._active(epoch) and (self.staircase or not self._steps()):
            self._set_lr(self.initial_lr * self.multiplier(epoch))

    def on_train_batch_begin(self, batch, logs=None):
        steps = self._steps()
        if self.staircase or not steps:
            return
        epoch = self._epoch + batch / steps
        if self._active(epoch):
            self._set_lr(self.initial_lr * self.multiplier(epoch))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = self._current_lr()


def _check_epoch(name, value):
    check_number(name, value, what="a number of epochs")


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Warms the learning rate up from `initial_lr / size()` to `initial_lr`, batch by batch.

    Large scaled learning rates are unstable in the first epochs (Goyal et al. 2017): this starts at the
    single-worker rate and grows linearly over `warmup_epochs`, reaching exactly `initial_lr` at the end of
    the last warm-up epoch.

    Args:
        initial_lr: the target (scaled) learning rate, e.g. `scale_learning_rate(0.01)`.
        warmup_epochs: number of warm-up epochs (0 turns warm-up off).
        momentum_correction: scale SGD's momentum with each change of the rate (as in Horovod).
        steps_per_epoch: batches per epoch; defaults to what `fit` knows (per-epoch steps otherwise).
        verbose: 1 prints a line on rank 0 when warm-up ends.

    Raises:
        ValueError: warmup_epochs < 0, a negative or non-finite initial_lr.

    Example:
        >>> LearningRateWarmupCallback(hvd.scale_learning_rate(0.01), warmup_epochs=3)
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0):
        _check_epoch("warmup_epochs", warmup_epochs)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

        def multiplier(epoch):
            size = C.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier=multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs if warmup_epochs > 0 else 1,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )

    def _active(self, epoch):
        return self.warmup_epochs > 0 and super()._active(epoch)

    def on_epoch_end(self, epoch, logs=None):
        if self.warmup_epochs > 0 and epoch == math.ceil(self.warmup_epochs) - 1:
            self._set_lr(self.initial_lr)
            if self.verbose:
                message = f"\nEpoch {epoch + 1}: finished learning rate warm-up to {self.initial_lr:g}."
                rank_zero.on_rank_zero(print, message, wait=False)
        super().on_epoch_end(epoch, logs)
