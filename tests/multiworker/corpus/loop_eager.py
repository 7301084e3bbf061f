"""A custom training loop run eagerly: tf.GradientTape and optimizer.apply_gradients over a tf.data pipeline,
the epoch's mean loss kept in a Keras metric and printed by the script ("Writing a training loop from
scratch", before tf.function)."""

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(3)
rng = np.random.default_rng(0)
x = rng.standard_normal((512, 16)).astype("float32")
y = (x @ rng.random((16, 1)) / 4).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)

model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(0.05)
loss_fn = keras.losses.MeanSquaredError()
loss_tracker = keras.metrics.Mean()
history = {"loss": []}
for epoch in range(3):
    for xb, yb in dataset:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply_gradients(zip(grads, model.trainable_weights))
        loss_tracker.update_state(loss)
    history["loss"].append(float(loss_tracker.result()))
    print(f"loop: epoch {epoch} loss {history['loss'][-1]:.6f}")
    loss_tracker.reset_state()
