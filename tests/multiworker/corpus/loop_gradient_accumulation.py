"""Gradient accumulation written in the loop: the gradients of 4 batches summed in variables of the script's
own, then averaged and applied once, in a tf.function loop over a tf.data pipeline."""

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(11)
rng = np.random.default_rng(8)
x = rng.standard_normal((512, 10)).astype("float32")
y = (x @ rng.random((10, 1)) / 3).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
STEPS = 4

model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
optimizer = keras.optimizers.Adam(1e-2)
accumulated = [tf.Variable(tf.zeros_like(v), trainable=False) for v in model.trainable_variables]
loss_tracker = keras.metrics.Mean()


@tf.function
def accumulate(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    for acc, grad in zip(accumulated, tape.gradient(loss, model.trainable_variables)):
        acc.assign_add(grad)
    loss_tracker.update_state(loss)


@tf.function
def apply():
    optimizer.apply_gradients([(acc / STEPS, v) for acc, v in zip(accumulated, model.trainable_variables)])
    for acc in accumulated:
        acc.assign(tf.zeros_like(acc))


history = {"loss": []}
for epoch in range(3):
    for step, (xb, yb) in enumerate(dataset):
        accumulate(xb, yb)
        if (step + 1) % STEPS == 0:
            apply()
    history["loss"].append(float(loss_tracker.result()))
    print(f"loop: epoch {epoch} loss {history['loss'][-1]:.6f}")
    loss_tracker.reset_state()
