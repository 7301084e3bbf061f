"""Keras callbacks for data-parallel training, imported as `hvdkeras.callbacks`.

This folder sits at the top of the repository, beside `hvdkeras/`, but is installed as the subpackage
`hvdkeras.callbacks`: setup.cfg maps it with `package_dir` (`hvdkeras.callbacks = callbacks`), so an
installed hvdkeras (editable or not) has no top-level `callbacks` package, and these modules import the
rest of hvdkeras as `hvdkeras.*`. One module per concern: `broadcast` (identical weights before step 1),
`metrics` (exact global metrics), `learning_rate` (warm-up and schedules), `rank_zero` (files and
progress on rank 0 only).

Example:
    >>> callbacks = [
    ...     hvdkeras.callbacks.BroadcastGlobalVariablesCallback(0),
    ...     hvdkeras.callbacks.MetricAverageCallback(),
    ...     hvdkeras.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=3),
    ...     hvdkeras.callbacks.ModelCheckpoint("ckpt-{epoch:02d}.keras"),
    ... ]
"""

from hvdkeras._compat import is_version_greater_equal_than

from .broadcast import BroadcastGlobalVariablesCallback
from .metrics import MetricAverageCallback
from .schedules import LearningRateScheduleCallback, LearningRateWarmupCallback
from .writers import (
    BackupAndRestore,
    BestModelCheckpoint,
    CSVLogger,
    ModelCheckpoint,
    RankZeroOnly,
    TensorBoard,
    rank_zero_only,
)

__all__ = [
    "BackupAndRestore",
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "CSVLogger",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "ModelCheckpoint",
    "RankZeroOnly",
    "TensorBoard",
    "is_version_greater_equal_than",
    "rank_zero_only",
]
