"""Scaling the learning rate with the number of workers."""

from __future__ import annotations

import math
from typing import Any

import keras

from hvdkeras import _collectives as C
from hvdkeras._checks import check_int, check_number
from hvdkeras.settings import LR_SCALING_RULES

RULES = LR_SCALING_RULES  # the lr_scaling setting's choices


def as_float(value: Any) -> float:
    """A learning rate's current value as a Python float: a number, a tensor, a `keras.Variable`, or the
    distributed variable a `tf.distribute` strategy's scope makes (which `float()` refuses).

    Raises:
        TypeError: a value that holds no single number.
    """
    if isinstance(value, bool):
        raise TypeError(f"a learning rate must be a number, not a bool. Received: {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    try:
        array = keras.ops.convert_to_numpy(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"a learning rate must be a number. Received: {value!r} ({err})") from None
    if getattr(array, "size", 0) != 1 or array.dtype.kind not in "iuf":
        raise TypeError(f"a learning rate must be a single number. Received: {value!r}")
    return float(array.reshape(()))


def check_learning_rate(name: str, value: Any) -> float:
    """Validates a learning-rate-like number: finite and >= 0.

    Raises:
        TypeError: not a number.
        ValueError: negative, NaN or infinite.
    """
    try:
        number = as_float(value)
    except TypeError:
        raise TypeError(f"`{name}` must be a number. Received: {name}={value!r}") from None
    check_number(name, number, error=ValueError)
    return number


def scale_factor(rule: str = "linear", size: int | None = None) -> float:
    """The factor `rule` applies for `size` workers (default: the current world size)."""
    if rule not in RULES:
        raise ValueError(f"`rule` must be one of {RULES}. Received: rule={rule!r}")
    if size is None:
        size = C.size()
    check_int("size", size)
    return {"linear": float(size), "sqrt": math.sqrt(size), "none": 1.0}[rule]


@keras.saving.register_keras_serializable(package="hvdkeras")
class ScaledLearningRateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A learning rate schedule multiplied by a constant factor.

    Args:
        schedule: the LearningRateSchedule to scale.
        factor: the multiplier.
    """

    def __init__(self, schedule: keras.optimizers.schedules.LearningRateSchedule, factor: float):
        self.schedule = schedule
        self.factor = float(factor)

    def __call__(self, step):
        return self.schedule(step) * self.factor

    def get_config(self):
        return {
            "schedule": keras.saving.serialize_keras_object(self.schedule),
            "factor": self.factor,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["schedule"] = keras.saving.deserialize_keras_object(config["schedule"])
        return cls(**config)


def scale_learning_rate(lr: Any, rule: str = "linear", size: int | None = None) -> Any:
    """Scales a learning rate for data-parallel training on `size` workers.

    "linear" multiplies by the number of workers (Goyal et al. 2017, pair it with a warm-up), "sqrt" by its
    square root, "none" leaves it.

    Args:
        lr: a float or a `keras.optimizers.schedules.LearningRateSchedule`.
        rule: "linear", "sqrt" or "none".
        size: the number of workers; defaults to `hvdkeras.size()`.

    Returns:
        A float, or a serializable `ScaledLearningRateSchedule` for a schedule.

    Raises:
        ValueError: an unknown rule, a negative or non-finite lr, a size < 1.

    Example:
        >>> opt = keras.optimizers.SGD(hvdkeras.scale_learning_rate(0.01))  # 0.02 on 2 workers
    """
    factor = scale_factor(rule, size)
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        return lr if factor == 1.0 else ScaledLearningRateSchedule(lr, factor)
    return check_learning_rate("lr", lr) * factor
