"""Clipping written in the loop: tf.clip_by_global_norm on the tape's gradients, then optimizer.apply_gradients,
in a tf.function step over a tf.data pipeline; and tf.clip_by_norm on each gradient in an eager epoch."""

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(12)
rng = np.random.default_rng(9)
x = rng.standard_normal((384, 10)).astype("float32")
y = (x @ rng.random((10, 1)) * 3).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)

model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(0.05)
loss_tracker = keras.metrics.Mean()
clipped = keras.metrics.Mean()  # the share of steps whose gradient's global norm was over the limit


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    grads, norm = tf.clip_by_global_norm(tape.gradient(loss, model.trainable_variables), 1.0)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    loss_tracker.update_state(loss)
    clipped.update_state(tf.cast(norm > 1.0, "float32"))


def eager_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    grads = [tf.clip_by_norm(g, 0.5) for g in tape.gradient(loss, model.trainable_variables)]
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    loss_tracker.update_state(loss)


history = {"loss": []}
for epoch in range(4):
    for xb, yb in dataset:
        (train_step if epoch < 3 else eager_step)(xb, yb)
    history["loss"].append(float(loss_tracker.result()))
    print(f"loop: epoch {epoch} loss {history['loss'][-1]:.6f} clipped {float(clipped.result()):.4f}")
    loss_tracker.reset_state()
    clipped.reset_state()
