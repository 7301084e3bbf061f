"""Layers written with tf.experimental.numpy ("TensorFlow NumPy" models): a dense layer and an activation in
NumPy style inside a Keras model."""

import keras
import numpy as np
import tensorflow as tf
import tensorflow.experimental.numpy as tnp


class NumpyDense(keras.layers.Layer):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units), initializer="glorot_uniform")
        self.b = self.add_weight(shape=(self.units,), initializer="zeros")

    def call(self, inputs):
        return tnp.add(tnp.matmul(inputs, tnp.asarray(self.w)), tnp.asarray(self.b))


class NumpyRelu(keras.layers.Layer):
    def call(self, inputs):
        return tnp.maximum(inputs, tnp.zeros_like(inputs))


keras.utils.set_random_seed(29)
rng = np.random.default_rng(28)
x = rng.random((1024, 8)).astype("float32")
y = (x @ rng.random((8, 1)) + 0.1 * rng.standard_normal((1024, 1))).astype("float32")

model = keras.Sequential([keras.Input(shape=(8,)), NumpyDense(16), NumpyRelu(), NumpyDense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
model.summary()
history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=6, verbose=2)
