"""A loop over NumPy arrays sliced by hand into batches (no tf.data), eager, with Adam."""

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(8)
rng = np.random.default_rng(5)
x = rng.standard_normal((300, 10)).astype("float32")
y = (x @ rng.random((10, 1))).astype("float32")

model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
optimizer = keras.optimizers.Adam(1e-2)
history = {"loss": []}
for epoch in range(3):
    losses = []
    for start in range(0, len(x), 50):
        xb, yb = x[start:start + 50], y[start:start + 50]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        losses.append(float(loss))
    history["loss"].append(float(np.mean(losses)))
    print(f"loop: epoch {epoch} loss {history['loss'][-1]:.6f}")
