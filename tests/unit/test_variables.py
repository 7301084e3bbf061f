"""hvdkeras.variables: the one way to the tf.Variable behind a Keras 3 variable."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras.variables import tf_variable, to_tensor, var_id


def test_a_keras_variable_and_its_tf_variable_are_one_variable():
    var = keras.Variable(np.ones(2, "float32"))
    inner = tf_variable(var)
    assert isinstance(inner, tf.Variable) and tf_variable(inner) is inner
    assert var_id(var) == var_id(inner) != var_id(keras.Variable(np.ones(2, "float32")))
    np.testing.assert_array_equal(to_tensor(var), [1.0, 1.0])
    np.testing.assert_array_equal(to_tensor([3, 4]), [3, 4])


def test_anything_else_is_refused_naming_its_type():
    with pytest.raises(TypeError, match="Received: variable=.* of type ndarray"):
        tf_variable(np.zeros(2))


class _Thing:
    pass


def test_collective_names_never_follow_a_reused_id(monkeypatch):
    """Two workers name collectives in the order they first reduce an object. An object that died may leave its
    id to a new one on one worker (CPython reuses freed memory) and not on another: both must give the new object
    the same, new name, or each would wait on a collective the other never submits. The reuse is made certain
    here: on the "reusing" worker every object has the id 42."""
    import gc

    from hvdkeras import variables
    from hvdkeras.variables import NamesByIdentity

    reusing, fresh = NamesByIdentity("p"), NamesByIdentity("p")
    first = _Thing()
    monkeypatch.setattr(variables, "id", lambda obj: 42, raising=False)
    given = [reusing.name_for(first), reusing.name_for(first)]
    monkeypatch.undo()
    given.append(fresh.name_for(first))
    del first
    gc.collect()
    assert given == ["p.0", "p.0", "p.0"]
    second = _Thing()
    monkeypatch.setattr(variables, "id", lambda obj: 42, raising=False)
    reused = [reusing.name_for(second), reusing.name_for(second)]
    monkeypatch.undo()
    assert reused == ["p.1", "p.1"]  # not "p.0", the dead object's name; and stable from step to step
    assert fresh.name_for(second) == "p.1"  # the worker where the id was not reused agrees
    pair = [_Thing(), _Thing()]
    assert reusing.name_for(pair) == fresh.name_for(pair) == "p.2" and fresh.name_for(list(pair)) == "p.2"
