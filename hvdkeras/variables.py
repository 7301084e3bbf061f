"""The one way to reach the tf.Variable behind a Keras 3 variable, and an identity shared by both."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def tf_variable(variable: Any) -> tf.Variable:
    """The tf.Variable behind a Keras 3 variable (or the tf.Variable itself).

    Raises:
        TypeError: `variable` is neither.
    """
    if isinstance(variable, tf.Variable):
        return variable
    inner = getattr(variable, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    raise TypeError(
        "Expected a keras.Variable or tf.Variable. "
        f"Received: variable={variable!r} of type {type(variable).__name__}"
    )


def var_id(variable: Any) -> int:
    """Identity of a variable, the same for a keras.Variable and the tf.Variable inside it."""
    inner = getattr(variable, "value", None)
    return id(inner) if isinstance(inner, tf.Variable) else id(variable)


def to_tensor(value: Any) -> tf.Tensor:
    """A tensor of `value`'s current value; a Keras 3 variable is read through its tf.Variable."""
    try:
        return tf.convert_to_tensor(tf_variable(value))
    except TypeError:
        return tf.convert_to_tensor(value)


class VariableList(list):
    """A list of variables that may also be called, returning a copy: Keras 2's `optimizer.variables()` was a
    method, Keras 3's `optimizer.variables` is a list, and scripts written for either keep working."""

    def __call__(self) -> list:
        return list(self)
