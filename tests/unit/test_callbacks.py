"""Callbacks in one process: rank-0 gating (faked rank), progress silencing, backup and restore."""

import keras
import numpy as np
import pytest

from hvdkeras import rank_zero as rank_zero_module
from hvdkeras import saving


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.calls = []

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(epoch)


@pytest.mark.parametrize("rank_zero", [True, False])
def test_rank_zero_only_gates_every_hook(hvd, monkeypatch, rank_zero):
    monkeypatch.setattr(rank_zero_module, "is_rank_zero", lambda: rank_zero)
    inner = Recorder()
    cb = hvd.callbacks.rank_zero_only(inner)
    cb.on_epoch_end(0, {})
    assert inner.calls == ([0] if rank_zero else [])
    with pytest.raises(TypeError, match="Received: callback="):
        hvd.callbacks.rank_zero_only("checkpoint")


@pytest.mark.parametrize("rank_zero, expected", [(True, 1), (False, 0)])
def test_progress_bar_silenced_off_rank_zero(hvd, monkeypatch, rank_zero, expected):
    monkeypatch.setattr(rank_zero_module, "is_rank_zero", lambda: rank_zero)
    progbar = keras.callbacks.ProgbarLogger()
    keras.callbacks.CallbackList([hvd.callbacks.MetricAverageCallback(), progbar], verbose=1, epochs=1, steps=2)
    assert progbar.verbose == expected


def test_checkpoint_subclasses_write_only_on_rank_zero(hvd, monkeypatch, tmp_path):
    monkeypatch.setattr(rank_zero_module, "is_rank_zero", lambda: False)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(np.ones((4, 2)), np.zeros((4, 1)), epochs=2, verbose=0,
              callbacks=[hvd.callbacks.ModelCheckpoint(str(tmp_path / "c-{epoch}.keras")),
                         hvd.callbacks.CSVLogger(str(tmp_path / "log.csv"))])
    assert list(tmp_path.iterdir()) == []


def test_backup_and_restore_resumes_epoch(hvd, tmp_path):
    def run(epochs, stop_after=None):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")

        class Stop(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if stop_after is not None and epoch + 1 == stop_after:
                    raise KeyboardInterrupt

        cbs = [hvd.callbacks.BackupAndRestore(str(tmp_path / "backup")), Stop()]
        try:
            history = model.fit(np.ones((4, 2)), np.zeros((4, 1)), epochs=epochs, verbose=0, callbacks=cbs)
        except KeyboardInterrupt:
            return None
        return history

    assert run(4, stop_after=2) is None
    assert (tmp_path / "backup" / "training_metadata.json").exists()
    history = run(4)
    assert history.epoch == [2, 3]
    assert not (tmp_path / "backup").exists()


def test_atomic_path_never_leaves_a_partial_file(tmp_path):
    target = tmp_path / "m.weights.h5"
    with pytest.raises(RuntimeError):
        with saving.atomic_path(target) as tmp:
            assert tmp.endswith(".weights.h5")
            with open(tmp, "w") as f:
                f.write("half")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / ".m.killed.tmp.weights.h5").write_text("half")  # what a killed earlier save left
    with saving.atomic_path(target) as tmp:
        with open(tmp, "w") as f:
            f.write("whole")
    assert target.read_text() == "whole"
    assert [p.name for p in tmp_path.iterdir()] == ["m.weights.h5"]


def test_metric_average_averages_a_custom_steps_plain_logs(hvd, monkeypatch):
    """A custom train_step's plain values (a GAN's d_loss) are averaged over the workers in the epoch's logs;
    values that are the global metric results are left as they are."""
    import hvdkeras
    from hvdkeras import _collectives as C

    monkeypatch.setattr(C, "size", lambda: 2)
    reduced = []

    def allreduce(tensor, op=C.Average, name=None, **kwargs):
        reduced.append(name)
        return tensor + 1.0  # the other worker's values are ours + 2

    monkeypatch.setattr(C, "allreduce", allreduce)
    cb = hvdkeras.callbacks.MetricAverageCallback()
    cb._global = {"accuracy": np.float32(0.5)}
    logs = {"d_loss": 1.0, "accuracy": 0.5, "learning_rate": 0.1, "images": np.zeros(3)}
    cb.on_epoch_end(0, logs)
    assert logs == {"d_loss": 2.0, "accuracy": 0.5, "learning_rate": 0.1, "images": logs["images"]}
    assert reduced == ["hvdkeras.logs.epoch"]
    test_logs = {"loss": 3.0}
    cb.on_test_end(test_logs)  # an evaluation's plain values, then fit's "val_" copy of them stays
    epoch_logs = {"loss": 1.0, "val_loss": test_logs["loss"]}
    cb.on_epoch_end(1, epoch_logs)
    assert test_logs == {"loss": 4.0} and epoch_logs == {"loss": 2.0, "val_loss": 4.0}
