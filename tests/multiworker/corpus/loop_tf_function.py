"""The structure of Keras's guide "Writing a training loop from scratch in TensorFlow": a tf.function train
step and test step, Keras metric objects reset every epoch, a validation loop, the results printed per epoch."""

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(4)
rng = np.random.default_rng(1)
x = rng.standard_normal((640, 20)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("int64")
train = tf.data.Dataset.from_tensor_slices((x[:512], y[:512])).batch(64)
val = tf.data.Dataset.from_tensor_slices((x[512:], y[512:])).batch(64)

inputs = keras.Input(shape=(20,), name="digits")
h = keras.layers.Dense(32, activation="relu")(inputs)
outputs = keras.layers.Dense(2, name="predictions")(h)
model = keras.Model(inputs=inputs, outputs=outputs)
optimizer = keras.optimizers.Adam(learning_rate=1e-2)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
train_acc_metric = keras.metrics.SparseCategoricalAccuracy()
val_acc_metric = keras.metrics.SparseCategoricalAccuracy()
loss_tracker = keras.metrics.Mean()


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        logits = model(xb, training=True)
        loss_value = loss_fn(yb, logits)
    grads = tape.gradient(loss_value, model.trainable_weights)
    optimizer.apply_gradients(zip(grads, model.trainable_weights))
    train_acc_metric.update_state(yb, logits)
    loss_tracker.update_state(loss_value)
    return loss_value


@tf.function
def test_step(xb, yb):
    val_acc_metric.update_state(yb, model(xb, training=False))


history = {"loss": []}
for epoch in range(4):
    for xb, yb in train:
        train_step(xb, yb)
    for xb, yb in val:
        test_step(xb, yb)
    history["loss"].append(float(loss_tracker.result()))
    print(f"loop: epoch {epoch} loss {float(loss_tracker.result()):.6f} "
          f"acc {float(train_acc_metric.result()):.4f} val_acc {float(val_acc_metric.result()):.4f}")
    train_acc_metric.reset_state()
    val_acc_metric.reset_state()
    loss_tracker.reset_state()
