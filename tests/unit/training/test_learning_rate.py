"""hvdkeras.training.learning_rate: scale_learning_rate and its checks."""

import math

import keras
import pytest

from hvdkeras.training.learning_rate import ScaledLearningRateSchedule, scale_learning_rate


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

