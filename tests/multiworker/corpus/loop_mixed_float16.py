"""A custom loop under the mixed_float16 policy with a LossScaleOptimizer: the loss scaled, the gradients
taken of the scaled loss, and the optimizer unscaling them and skipping the steps that overflow."""

import keras
import numpy as np
import tensorflow as tf

keras.mixed_precision.set_global_policy("mixed_float16")
keras.utils.set_random_seed(7)
rng = np.random.default_rng(4)
x = rng.standard_normal((384, 16)).astype("float32")
y = (x @ rng.random((16, 1)) / 4).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)

model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(1, dtype="float32")])
optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
loss_fn = keras.losses.MeanSquaredError()
loss_tracker = keras.metrics.Mean()


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
        scaled = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    loss_tracker.update_state(loss)


history = {"loss": []}
for epoch in range(3):
    for xb, yb in dataset:
        train_step(xb, yb)
    history["loss"].append(float(loss_tracker.result()))
    print(f"loop: epoch {epoch} loss {history['loss'][-1]:.6f} scale {float(optimizer.dynamic_scale):.1f}")
    loss_tracker.reset_state()
keras.mixed_precision.set_global_policy("float32")
