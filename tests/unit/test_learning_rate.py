"""scale_learning_rate and the learning-rate callbacks in one process."""

import math

import keras
import numpy as np
import pytest

from hvdkeras.learning_rate import ScaledLearningRateSchedule, scale_learning_rate


@pytest.mark.parametrize("rule, expected", [("linear", 0.04), ("sqrt", 0.01 * math.sqrt(4)), ("none", 0.01)])
def test_scale_float(rule, expected):
    assert scale_learning_rate(0.01, rule=rule, size=4) == pytest.approx(expected)


def test_default_size_is_world_size(hvd):
    assert scale_learning_rate(0.01) == pytest.approx(0.01 * hvd.size())


def test_scale_schedule_and_serialize():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    scaled = scale_learning_rate(schedule, rule="linear", size=3)
    assert isinstance(scaled, ScaledLearningRateSchedule)
    assert float(scaled(10)) == pytest.approx(0.15)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(scaled))
    assert float(restored(10)) == pytest.approx(0.15)
    opt = keras.optimizers.SGD(scaled)
    assert keras.optimizers.SGD.from_config(opt.get_config()).get_config()["learning_rate"]["config"]["factor"] == 3


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"lr": -0.1}, ValueError, "Received: lr=-0.1"),
        ({"lr": float("nan")}, ValueError, "Received: lr=nan"),
        ({"lr": "fast"}, TypeError, "Received: lr='fast'"),
        ({"lr": 0.1, "rule": "cubic"}, ValueError, "Received: rule='cubic'"),
        ({"lr": 0.1, "size": 0}, ValueError, "Received: size=0"),
    ],
)
def test_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        scale_learning_rate(size=kwargs.pop("size", 2), **kwargs)


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


def _fit(hvd, callbacks, momentum=0.9, epochs=3):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=momentum)), loss="mse")
    history = model.fit(np.ones((8, 2)), np.zeros((8, 1)), batch_size=4, epochs=epochs, verbose=0,
                        callbacks=callbacks)
    return model, history


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
