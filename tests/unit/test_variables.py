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
