"""Several steps per call of the compiled train function (compile(steps_per_execution=4)) on a tf.data
pipeline."""

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(16)
rng = np.random.default_rng(15)
x = rng.random((1024, 16)).astype("float32")
y = (x @ rng.random((16, 1)) + 0.1 * rng.standard_normal((1024, 1))).astype("float32")
train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=1).batch(32)

model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"], steps_per_execution=4)
history = model.fit(train, epochs=8, verbose=2)
