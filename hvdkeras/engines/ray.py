"""Ray Train: report rank 0's checkpoints through `ray.train.report`, and resume from them.

    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    def train_loop(config):
        hvdkeras.init()                          # TensorflowTrainer's TF_CONFIG forms the job
        model = build_and_compile(...)           # with an hvdkeras.DistributedOptimizer
        model.fit(shard, epochs=config["epochs"],
                  callbacks=[hvdkeras.callbacks.BroadcastGlobalVariablesCallback(0),
                             hvdkeras.callbacks.MetricAverageCallback(),
                             hvdkeras.ray.ReportCheckpointCallback()])

    TensorflowTrainer(train_loop, train_loop_config={"epochs": 8},
                      scaling_config=ScalingConfig(num_workers=(1, 4)),
                      run_config=RunConfig(failure_config=FailureConfig(max_failures=3))).fit()

Ray's own `ray.train.tensorflow.keras.ReportCheckpointCallback` saves a checkpoint on every worker and
does not resume. This one takes the same arguments; rank 0 alone writes the checkpoint (the others report
their metrics with it, as `ray.train.report` needs every worker to call it), and when Ray restarts the
workers (`FailureConfig`, or a resize under `ScalingConfig(num_workers=(min, max))`), the restarted fit
starts from the last reported checkpoint. Needs `pip install hvdkeras[ray]`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Union

import keras

from hvdkeras import basics
from hvdkeras.callbacks._base import HvdCallback
from hvdkeras.training import rank_zero
from hvdkeras.training.optimizer import unwrap

MODEL_FILE = "model.keras"  # the whole model (with its optimizer's state), loadable with keras.models.load_model
STATE_FILE = "hvdkeras.json"  # where in the training the checkpoint was taken
EVENTS = ("train_begin", "train_end", "epoch_begin", "epoch_end", "train_batch_begin", "train_batch_end",
          "test_begin", "test_end", "test_batch_begin", "test_batch_end", "predict_begin", "predict_end",
          "predict_batch_begin", "predict_batch_end")

Events = Union[str, "list[str]"]
_resumed: set = set()  # the checkpoints this process has resumed from


def _events(name: str, value) -> list[str]:
    events = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if events is None or any(e not in EVENTS for e in events):
        raise ValueError(f"`{name}` must be a Keras callback event (less the 'on_'), or a list of them: one of "
                         f"{', '.join(EVENTS)}. Received: {name}={value!r}")
    return events


class ReportCheckpointCallback(HvdCallback):
    """Reports metrics and rank 0's checkpoint to Ray Train, and resumes `fit` from the last checkpoint.

    The checkpoint is a directory with `model.keras` (the model and its optimizer's state) and
    `hvdkeras.json` (the epochs completed). At `on_train_begin`, when Ray hands this worker a checkpoint
    (`ray.train.get_checkpoint()`: after a restart, or a `resume_from_checkpoint`), the model's weights and
    its optimizer's state are loaded from it on every rank, and `fit` goes on at the first epoch the
    checkpoint had not completed. The learning rate is not loaded: it stays what the script set for the
    current world size, which may differ from the one the checkpoint was written with. A checkpoint taken
    inside an epoch (`checkpoint_on="train_batch_end"`) resumes at the start of that epoch. A process
    resumes from a checkpoint once: a later `fit` in the same worker goes on from the model as it is.

    Put it after `MetricAverageCallback`, so that the metrics reported are the averages over the workers.

    Args:
        checkpoint_on: the Keras event(s), less the `on_`, at which to save and report a checkpoint
            ("epoch_end" by default; "train_end", "train_batch_end", ...).
        report_metrics_on: the event(s) at which to report metrics without a checkpoint. Metrics are always
            reported with a checkpoint.
        metrics: which logs to report: None for all; a name or a list of names; or a dict of reported name
            to Keras log name.
        resume: load the checkpoint that Ray hands this worker at the start of `fit` (default True).

    Raises:
        ValueError: an event that Keras does not have, or (at the start of fit, with a checkpoint to load) a
            model that is not built yet.
        KeyError: a metric named in `metrics` that is not in the logs.

    Example:
        >>> model.fit(shard, epochs=8, callbacks=[hvdkeras.callbacks.BroadcastGlobalVariablesCallback(0),
        ...                                       hvdkeras.callbacks.MetricAverageCallback(),
        ...                                       hvdkeras.ray.ReportCheckpointCallback()])
    """

    def __init__(self, checkpoint_on: Events = "epoch_end", report_metrics_on: Events = "epoch_end",
                 metrics: Union[str, list, dict, None] = None, resume: bool = True):
        super().__init__()
        self._checkpoint_on = _events("checkpoint_on", checkpoint_on)
        self._report_metrics_on = _events("report_metrics_on", report_metrics_on)
        if not (metrics is None or isinstance(metrics, (str, list, tuple, dict))):
            raise ValueError(f"`metrics` must be None, a log name, a list of log names or a dict of reported name "
                             f"to log name. Received: metrics={metrics!r}")
        self._metrics = metrics
        self._resume = bool(resume)
        self._epoch = 0  # the epoch in progress, for a checkpoint taken inside it
        self.restored_from = None  # the checkpoint this fit resumed from, if any
        # Each chosen event's hook reports after doing its own work (on_epoch_end counts the epoch first).
        for event in set(self._checkpoint_on) | set(self._report_metrics_on):
            method = f"on_{event}"
            setattr(self, method, self._handler(event, getattr(self, method)))

    def _handler(self, event: str, hook):
        """`hook` (this class's own, or Keras's no-op), then the report; Keras passes logs by name or position."""

        def handle(*args, **kwargs):
            hook(*args, **kwargs)
            logs = kwargs.get("logs", args[-1] if args and isinstance(args[-1], dict) else None)
            self._report(event, logs or {})

        return handle

    def on_train_begin(self, logs=None):
        if self._resume:
            import ray.train

            checkpoint = ray.train.get_checkpoint()
            # Ray hands a worker the checkpoint it started from for as long as it runs: a later fit in the
            # same worker (a loop of fits) goes on from where the last one ended instead.
            if checkpoint is not None and checkpoint.path not in _resumed:
                restore(self.model, checkpoint)
                _resumed.add(checkpoint.path)
                self.restored_from = checkpoint

    def on_train_end(self, logs=None):
        if self.restored_from is not None:
            self.model._initial_epoch = None  # a later fit of this model starts where its caller says

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        self._epoch = epoch + 1

    def _reported_metrics(self, logs: dict) -> dict:
        if self._metrics is None:
            names = {k: k for k in logs}
        elif isinstance(self._metrics, str):
            names = {self._metrics: self._metrics}
        elif isinstance(self._metrics, dict):
            names = dict(self._metrics)
        else:
            names = {k: k for k in self._metrics}
        missing = sorted(v for v in names.values() if v not in logs)
        if missing:
            raise KeyError(f"ReportCheckpointCallback: the logs have no {', '.join(map(repr, missing))}. "
                           f"Received logs with: {', '.join(sorted(logs)) or 'nothing'}")
        return {name: _plain(logs[key]) for name, key in names.items()}

    def _report(self, event: str, logs: dict) -> None:
        import ray.train

        metrics = self._reported_metrics(logs)
        if event not in self._checkpoint_on:
            ray.train.report(metrics)
            return
        # ray.train.report is a barrier: every rank calls it, and only rank 0 hands it a checkpoint.
        folder = tempfile.mkdtemp(prefix="hvdkeras-ray-") if rank_zero.is_rank_zero() else None
        try:
            checkpoint = None
            if folder is not None:
                self.model.save(os.path.join(folder, MODEL_FILE))
                with open(os.path.join(folder, STATE_FILE), "w") as f:
                    json.dump({"epochs_completed": self._epoch, "size": basics.size(), "event": event}, f)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report(metrics, checkpoint=checkpoint)
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def _plain(value):
    """A log value as a Python number where it is one (Ray's metrics are JSON-like)."""
    try:
        return value.item() if hasattr(value, "item") else value
    except (TypeError, ValueError):
        return value


def restore(model, checkpoint) -> int:
    """Loads a checkpoint written by ReportCheckpointCallback into `model`; returns the epochs it completed.

    The weights and the optimizer's state (slots, iterations) are loaded; the learning rate keeps its
    current value. The next `fit` of the model starts at the returned epoch.

    Args:
        model: a built Keras model, compiled with the optimizer it was checkpointed with.
        checkpoint: a `ray.train.Checkpoint` holding `model.keras` and `hvdkeras.json`.

    Returns:
        The number of epochs the checkpoint had completed.

    Raises:
        ValueError: the checkpoint was not written by ReportCheckpointCallback, or the model is not built.
    """
    if not model.built:
        raise ValueError(f"hvdkeras.ray can resume model {model.name!r} only once it is built: build it before "
                         f"fit by calling it on a batch (model(x[:1])), or give it an Input.")
    with checkpoint.as_directory() as folder:
        paths = [os.path.join(folder, name) for name in (MODEL_FILE, STATE_FILE)]
        if not all(os.path.exists(p) for p in paths):
            raise ValueError(f"The checkpoint at {checkpoint.path!r} was not written by hvdkeras.ray."
                             f"ReportCheckpointCallback: it holds {sorted(os.listdir(folder))}, expected "
                             f"{MODEL_FILE!r} and {STATE_FILE!r}.")
        optimizer = model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(model.trainable_variables)
        rate = _rate_variable(optimizer)
        kept = None if rate is None else rate.numpy()
        model.load_weights(paths[0])
        if rate is not None:
            rate.assign(kept)
        with open(paths[1]) as f:
            epochs = int(json.load(f)["epochs_completed"])
    model._initial_epoch = epochs  # what Keras's BackupAndRestore sets: the next fit starts at this epoch
    return epochs


def _rate_variable(optimizer):
    """The optimizer's learning-rate variable, or None for a schedule (which has none to keep)."""
    if optimizer is None:
        return None
    rate = getattr(unwrap(optimizer), "_learning_rate", None)
    return rate if isinstance(rate, keras.Variable) else None
