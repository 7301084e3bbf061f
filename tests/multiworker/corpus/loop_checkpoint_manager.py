"""A custom loop that checkpoints as TensorFlow's tutorials do: os.mkdir of the checkpoint folder, a
tf.train.Checkpoint of the model and optimizer saved by a tf.train.CheckpointManager every epoch, then a new
model and optimizer restored from the latest checkpoint, trained on."""

import os

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(10)
rng = np.random.default_rng(7)
x = rng.standard_normal((256, 12)).astype("float32")
y = (x @ rng.random((12, 1)) / 3).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
checkpoint_dir = "./training_checkpoints"
os.mkdir(checkpoint_dir)


def make():
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    return model, keras.optimizers.Adam(1e-2)


def train(model, optimizer, epochs, history):
    loss_tracker = keras.metrics.Mean()

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        loss_tracker.update_state(loss)

    for _ in range(epochs):
        for xb, yb in dataset:
            step(xb, yb)
        history["loss"].append(float(loss_tracker.result()))
        print(f"loop: epoch {len(history['loss'])} loss {history['loss'][-1]:.6f}")
        loss_tracker.reset_state()
        yield


history = {"loss": []}
model, optimizer = make()
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=2)
for _ in train(model, optimizer, 3, history):
    manager.save()
print(f"loop: saved {[os.path.basename(p) for p in manager.checkpoints]}")

# A new process would start here: the same objects made again, restored, and trained on.
model, optimizer = make()
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=2)
checkpoint.restore(manager.latest_checkpoint)
print(f"loop: restored {os.path.basename(manager.latest_checkpoint)}")
for _ in train(model, optimizer, 2, history):
    manager.save()
