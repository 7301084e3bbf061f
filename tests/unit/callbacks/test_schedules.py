"""hvdkeras.callbacks.schedules: the schedule and warm-up callbacks in one process."""

import keras
import numpy as np
import pytest


def _fit(hvd, callbacks, momentum=0.9, epochs=3):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=momentum)), loss="mse")
    history = model.fit(np.ones((8, 2)), np.zeros((8, 1)), batch_size=4, epochs=epochs, verbose=0,
                        callbacks=callbacks)
    return model, history


def test_callback_bad_values(hvd):
    with pytest.raises(ValueError, match="Received: warmup_epochs=-1"):
        hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=-1)
    with pytest.raises(ValueError, match="Received: initial_lr=-1"):
        hvd.callbacks.LearningRateWarmupCallback(-1)
    with pytest.raises(ValueError, match="Received: initial_lr=inf"):
        hvd.callbacks.LearningRateScheduleCallback(float("inf"), multiplier=1.0)
    with pytest.raises(ValueError, match="end_epoch"):
        hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=1.0, start_epoch=3, end_epoch=2)
    with pytest.raises(ValueError, match="Received: root_rank=-1"):
        hvd.callbacks.BroadcastGlobalVariablesCallback(-1)


def test_schedule_callback_staircase_with_function(hvd):
    cb = hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=lambda e: 0.5 ** e, start_epoch=1)
    _, history = _fit(hvd, [cb])
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.05, 0.025])


def test_schedule_callback_momentum_correction(hvd):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss="mse")
    model.optimizer.build(model.trainable_variables)
    slots = model.optimizer.inner_optimizer.momentums
    for m in slots:
        m.assign(np.ones(m.shape))
    for correction, expected in ((True, 0.5), (False, 1.0)):
        model.optimizer.learning_rate = 0.1
        for m in slots:
            m.assign(np.ones(m.shape))
        cb = hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=0.5, momentum_correction=correction)
        cb.set_model(model)
        cb.on_epoch_begin(0)
        assert float(model.optimizer.learning_rate) == pytest.approx(0.05)
        for m in slots:
            np.testing.assert_allclose(m.numpy(), expected)


def test_warmup_single_worker_is_constant(hvd):
    cb = hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2)
    _, history = _fit(hvd, [cb])
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.1, 0.1])
