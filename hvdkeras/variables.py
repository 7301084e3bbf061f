"""The one way to reach the tf.Variable behind a Keras 3 variable, an identity shared by both, and names for
collectives keyed by the objects they reduce."""

from __future__ import annotations

import itertools
import weakref
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


def _identity_object(obj: Any) -> Any:
    inner = getattr(obj, "value", None)
    return inner if isinstance(inner, tf.Variable) else obj


class NamesByIdentity:
    """Collective names for objects (an optimizer, a list of variables), in the order the process first asks for
    them: "<prefix>.0", "<prefix>.1", ...; the same on every worker, which runs the same code.

    Keyed by the objects themselves, never by a bare id(): once an object is garbage collected, Python may give
    its id to a new object on one worker and not on another (when each collects is its own), and a name found
    by a reused id would make the workers wait on differently named collectives for ever. A key whose objects
    are gone gets a new name, as on a worker where the id was not reused.
    """

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._names: dict[tuple[int, ...], tuple[str, list]] = {}
        self._count = itertools.count()

    def name_for(self, objects: Any) -> str:
        objects = [_identity_object(o) for o in (objects if isinstance(objects, (list, tuple)) else [objects])]
        key = tuple(id(o) for o in objects)
        held = self._names.get(key)
        if held is None or any(ref() is not obj for ref, obj in zip(held[1], objects)):
            held = (f"{self.prefix}.{next(self._count)}", [weakref.ref(o) for o in objects])
            self._names[key] = held
        return held[0]

    def clear(self) -> None:
        self._names.clear()
        self._count = itertools.count()

    def __len__(self) -> int:
        return len(self._names)
