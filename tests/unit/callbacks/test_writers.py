"""hvdkeras.callbacks.writers: callbacks gated on rank 0 (a faked rank), progress bars, checkpoints and backups."""

import os

import keras
import numpy as np
import pytest

from hvdkeras.training import rank_zero as rank_zero_module


def test_checkpoint_callback_writes_through_a_temporary_name(hvd, tmp_path, monkeypatch):
    seen = []
    original = keras.Model.save

    def spy(self, filepath, *args, **kwargs):
        seen.append(str(filepath))
        return original(self, filepath, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", spy)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(np.zeros((4, 3)), np.zeros((4, 1)), epochs=1, verbose=0,
              callbacks=[hvd.callbacks.ModelCheckpoint(str(tmp_path / "c.keras"))])
    assert len(seen) == 1 and ".tmp" in seen[0] and seen[0] != str(tmp_path / "c.keras")
    assert [p.name for p in tmp_path.iterdir()] == ["c.keras"]


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


@pytest.mark.parametrize("cut", ["before the commit", "after the commit"])
def test_a_backup_cut_short_resumes_from_one_whole_backup(hvd, tmp_path, monkeypatch, cut):
    # A crash between Keras's two files must never give the weights of one epoch with the epoch of another
    # (the resume would train an epoch twice): it resumes from the last backup (before the commit) or from the
    # new one (after it), whole.
    from callbacks import writers as rz

    def model_at(epochs):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
        if epochs:
            model.fit(np.ones((4, 2)), np.ones((4, 1)), epochs=epochs, verbose=0)
        return model

    backup = rz.BackupAndRestore(str(tmp_path / "backup"))
    backup.set_model(model_at(1))
    backup._current_epoch = 1
    backup._write_backup()
    backup.set_model(model_at(2))
    backup._current_epoch = 2
    real_replace = os.replace

    def crash(src, dst):
        if (cut == "before the commit" and dst == backup._training_metadata_path) or (
                cut == "after the commit" and dst == backup._weights_path):
            raise KeyboardInterrupt("killed")
        return real_replace(src, dst)

    monkeypatch.setattr(rz.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        backup._write_backup()
    monkeypatch.setattr(rz.os, "replace", real_replace)
    assert any(rz.BackupAndRestore.PENDING in p.name for p in (tmp_path / "backup").iterdir())

    resumed = model_at(0)
    restore = rz.BackupAndRestore(str(tmp_path / "backup"))
    restore.set_model(resumed)
    restore.on_train_begin()
    epoch, expected = (1, model_at(1)) if cut == "before the commit" else (2, model_at(2))
    assert resumed._initial_epoch == epoch
    assert sorted(p.name for p in (tmp_path / "backup").iterdir()) == ["latest.weights.h5", "training_metadata.json"]
    for got, want in zip(resumed.get_weights(), expected.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert not any(rz.BackupAndRestore.PENDING in p.name for p in (tmp_path / "backup").iterdir())
