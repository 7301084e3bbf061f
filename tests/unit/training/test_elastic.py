"""Elastic state and callbacks in one process (Horovod size 1)."""

import keras
import numpy as np
import pytest


def make(hvd):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss="mse")
    return model, hvd.elastic.KerasState(model, epoch=0, batch=0, steps=0)


def test_commit_restore_and_sync(hvd):
    model, state = make(hvd)
    committed = [w.copy() for w in model.get_weights()]
    model.fit(np.ones((8, 3)), np.zeros((8, 2)), batch_size=4, verbose=0)
    state.epoch, state.steps = 1, 2
    assert not np.allclose(model.get_weights()[0], committed[0])
    state.restore()  # a failure before any commit: back to the constructor's snapshot
    np.testing.assert_array_equal(model.get_weights()[0], committed[0])
    assert (state.epoch, state.steps) == (0, 0)
    model.fit(np.ones((8, 3)), np.zeros((8, 2)), batch_size=4, verbose=0)
    state.steps = 2
    state.commit()
    after = [w.copy() for w in model.get_weights()]
    model.fit(np.ones((8, 3)), np.zeros((8, 2)), batch_size=4, verbose=0)
    state.restore()
    np.testing.assert_array_equal(model.get_weights()[0], after[0])
    assert state.steps == 2
    state.sync()  # size 1: a no-op broadcast that keeps the values
    np.testing.assert_array_equal(model.get_weights()[0], after[0])


def test_callbacks_track_batch_epoch_and_commit(hvd):
    model, state = make(hvd)
    commits = []
    state.save = lambda: commits.append((state.epoch, state.batch))
    state.batch = 2  # resuming inside an epoch: fit starts at batch 2
    model.fit(np.ones((12, 3)), np.zeros((12, 2)), batch_size=4, epochs=1, verbose=0,
              callbacks=state.callbacks(batches_per_commit=2))
    assert (state.epoch, state.batch) == (1, 0)
    assert commits == [(0, 4), (1, 0)]
    with pytest.raises(ValueError, match="Received: batches_per_commit=0"):
        hvd.elastic.CommitStateCallback(state, batches_per_commit=0)


def test_reset_rescales_the_learning_rate(hvd, monkeypatch, fake_seam):
    model, state = make(hvd)  # built at size 1: base lr 0.1
    fake_seam.set(size=3)
    state.reset()
    assert float(model.optimizer.learning_rate) == pytest.approx(0.3)
