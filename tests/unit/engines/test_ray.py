"""hvdkeras.ray in one process, with ray.train's report and get_checkpoint recorded (the real Ray Train runs
are in tests/multiworker/test_ray_2w.py)."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import keras
import numpy as np
import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (make install installs it)")
import ray.train  # noqa: E402

import hvdkeras.ray  # noqa: E402
from hvdkeras.training import rank_zero  # noqa: E402

X = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
Y = X @ np.arange(1, 5, dtype="float32").reshape(4, 1)


def model(hvd, seed=0, lr=0.01):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(lr)), loss="mse", metrics=["mae"])
    return m


class FakeTrain:
    """ray.train.report and get_checkpoint, recorded: each report's metrics and a copy of its checkpoint."""

    def __init__(self, monkeypatch, tmp_path, checkpoint=None):
        self.reports = []
        self.handed = []  # the folders the callback handed over
        self.tmp_path = tmp_path
        monkeypatch.setattr(ray.train, "report", self.report)
        monkeypatch.setattr(ray.train, "get_checkpoint", lambda: checkpoint)

    def report(self, metrics, checkpoint=None):
        kept = None
        if checkpoint is not None:
            kept = Path(tempfile.mkdtemp(dir=self.tmp_path))  # the callback removes its folder after the report
            shutil.copytree(checkpoint.path, kept, dirs_exist_ok=True)
            self.handed.append(checkpoint.path)
        self.reports.append((metrics, kept))


def test_rank_0_reports_a_checkpoint_after_every_epoch(hvd, tmp_path, monkeypatch):
    fake = FakeTrain(monkeypatch, tmp_path)
    model(hvd).fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[hvdkeras.ray.ReportCheckpointCallback()])
    assert [sorted(metrics) for metrics, _ in fake.reports] == [["loss", "mae"], ["loss", "mae"]]
    assert all(isinstance(v, float) for metrics, _ in fake.reports for v in metrics.values())
    for epochs, (_, folder) in enumerate(fake.reports, start=1):
        assert sorted(os.listdir(folder)) == ["hvdkeras.json", "model.keras"]
        assert json.loads((folder / "hvdkeras.json").read_text()) == {"epochs_completed": epochs, "size": 1,
                                                                       "event": "epoch_end"}
    loaded = keras.models.load_model(fake.reports[-1][1] / "model.keras", compile=False)
    assert len(loaded.get_weights()) == 2
    assert len(fake.handed) == 2 and not any(os.path.exists(p) for p in fake.handed)  # removed after each report


def test_other_ranks_report_metrics_without_a_checkpoint_and_write_nothing(hvd, tmp_path, monkeypatch):
    fake = FakeTrain(monkeypatch, tmp_path)
    monkeypatch.setattr(rank_zero, "is_rank_zero", lambda: False)
    made = []
    monkeypatch.setattr(hvdkeras.ray.tempfile, "mkdtemp", lambda **kw: made.append(kw) or str(tmp_path / "x"))
    model(hvd).fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[hvdkeras.ray.ReportCheckpointCallback()])
    assert [folder for _, folder in fake.reports] == [None, None]  # still two reports: report is a barrier
    assert made == []


def test_metrics_and_events_choose_what_is_reported_when(hvd, tmp_path, monkeypatch):
    fake = FakeTrain(monkeypatch, tmp_path)
    callback = hvdkeras.ray.ReportCheckpointCallback(checkpoint_on="train_end", report_metrics_on="train_batch_end",
                                                     metrics={"train_mae": "mae"})
    model(hvd).fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    assert len(fake.reports) == 2 * 4 + 1  # every batch, then the checkpoint at the end
    assert all(list(metrics) == ["train_mae"] for metrics, _ in fake.reports)
    assert [folder is not None for _, folder in fake.reports] == [False] * 8 + [True]
    assert json.loads((fake.reports[-1][1] / "hvdkeras.json").read_text())["epochs_completed"] == 2


def test_fit_resumes_from_the_checkpoint_ray_hands_back_with_the_current_rate(hvd, tmp_path, monkeypatch):
    monkeypatch.setattr(hvdkeras.ray, "_resumed", set())
    first = FakeTrain(monkeypatch, tmp_path)
    trained = model(hvd, seed=0, lr=0.01)
    trained.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[hvdkeras.ray.ReportCheckpointCallback()])
    checkpoint = ray.train.Checkpoint.from_directory(str(first.reports[-1][1]))

    FakeTrain(monkeypatch, tmp_path, checkpoint=checkpoint)
    resumed = model(hvd, seed=5, lr=0.02)  # other initial weights, and the rate of another world size
    seen = {}

    class Look(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen["weights"] = [w.copy() for w in self.model.get_weights()]
            seen["iterations"] = int(self.model.optimizer.iterations)
            seen["rate"] = float(self.model.optimizer.learning_rate)

        def on_epoch_begin(self, epoch, logs=None):
            seen.setdefault("epochs", []).append(epoch)

    reporter = hvdkeras.ray.ReportCheckpointCallback()
    resumed.fit(X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[reporter, Look()])
    assert reporter.restored_from is checkpoint
    assert all(np.array_equal(a, b) for a, b in zip(seen["weights"], trained.get_weights()))
    assert seen["iterations"] == 8  # Adam's slots and step count came back with the weights
    assert seen["rate"] == pytest.approx(0.02)  # the rate is not the checkpoint's 0.01
    assert seen["epochs"] == [2]  # epochs 0 and 1 were done

    seen.clear()  # a second fit in the same worker goes on from this one, not from Ray's checkpoint again
    after_first = [w.copy() for w in resumed.get_weights()]
    resumed.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[hvdkeras.ray.ReportCheckpointCallback(), Look()])
    assert all(np.array_equal(a, b) for a, b in zip(seen["weights"], after_first))
    assert seen["epochs"] == [0, 1]


def test_resume_false_starts_afresh(hvd, tmp_path, monkeypatch):
    first = FakeTrain(monkeypatch, tmp_path)
    model(hvd).fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[hvdkeras.ray.ReportCheckpointCallback()])
    FakeTrain(monkeypatch, tmp_path, checkpoint=ray.train.Checkpoint.from_directory(str(first.reports[0][1])))
    fresh = model(hvd)
    history = fresh.fit(X, Y, batch_size=8, epochs=2, verbose=0,
                        callbacks=[hvdkeras.ray.ReportCheckpointCallback(resume=False)])
    assert len(history.history["loss"]) == 2


def test_a_checkpoint_from_elsewhere_is_refused_with_what_it_holds(hvd, tmp_path):
    (tmp_path / "weights.h5").write_text("")
    with pytest.raises(ValueError, match=r"was not written by hvdkeras.ray.ReportCheckpointCallback: it holds "
                                         r"\['weights.h5'\], expected 'model.keras' and 'hvdkeras.json'"):
        hvdkeras.ray.restore(model(hvd), ray.train.Checkpoint.from_directory(str(tmp_path)))


def test_an_unbuilt_model_cannot_resume(hvd, tmp_path):
    lazy = keras.Sequential([keras.layers.Dense(1)], name="lazy")
    with pytest.raises(ValueError, match="can resume model 'lazy' only once it is built"):
        hvdkeras.ray.restore(lazy, ray.train.Checkpoint.from_directory(str(tmp_path)))


@pytest.mark.parametrize("kwargs, message", [
    ({"checkpoint_on": "epoch_finish"}, "`checkpoint_on` must be a Keras callback event"),
    ({"report_metrics_on": ["epoch_end", "batch"]}, "Received: report_metrics_on=['epoch_end', 'batch']"),
    ({"metrics": 3}, "`metrics` must be None, a log name, a list of log names or a dict"),
])
def test_bad_arguments_say_what_was_received(kwargs, message):
    with pytest.raises(ValueError) as err:
        hvdkeras.ray.ReportCheckpointCallback(**kwargs)
    assert message in str(err.value)


def test_a_metric_missing_from_the_logs_names_what_the_logs_have(hvd, tmp_path, monkeypatch):
    FakeTrain(monkeypatch, tmp_path)
    with pytest.raises(KeyError, match="the logs have no 'val_loss'. Received logs with: loss, mae"):
        model(hvd).fit(X, Y, epochs=1, verbose=0, callbacks=[hvdkeras.ray.ReportCheckpointCallback(metrics="val_loss")])
