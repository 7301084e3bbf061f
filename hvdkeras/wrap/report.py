"""--report-dir: each worker's steps per fit and the digest of its weights, written at the end of each fit."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import keras
import numpy as np

from hvdkeras import _collectives as C
from hvdkeras.training import saving
from hvdkeras.training.models import held_optimizers, sharded_optimizers
from hvdkeras.training.optimizer import DistributedOptimizer
from hvdkeras.wrap.state import STATE


def weights_digest(arrays: Any) -> str:
    """sha256 of the arrays' bytes in order: equal on two workers exactly when their weights are identical."""
    digest = hashlib.sha256()
    for w in arrays:
        digest.update(np.ascontiguousarray(np.asarray(w)).tobytes())
    return digest.hexdigest()


def report(model) -> None:
    """--report-dir: each worker writes rankN.json with its steps per fit, the digest of its final weights,
    which of the model's optimizers shard their state and each one's reducer, so a job's own CI can check that
    the workers stayed one job without changing the script."""
    sharded = list(sharded_optimizers(model))
    reducers = {name: repr(o.reducer) for name, o in held_optimizers(model).items()
                if isinstance(o, DistributedOptimizer)}
    saving.write_json_atomically(os.path.join(STATE.options.report_dir, f"rank{C.rank()}.json"),
                                 {"rank": C.rank(), "size": C.size(), "fit_steps": list(STATE.fits),
                                  "weights_sha256": weights_digest(model.get_weights()),
                                  "sharded_optimizers": sharded, "reducers": reducers})


class StepCounter(keras.callbacks.Callback):
    """--report-dir only: counts a fit's steps and, at its end, writes the worker's report."""

    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def on_train_end(self, logs=None):
        STATE.fits.append(self.steps)
        report(self.model)


def with_report(callbacks: list) -> list:
    """The fit's callbacks, with a step counter last when --report-dir asks for reports."""
    return callbacks + [StepCounter()] if STATE.options.report_dir else callbacks
