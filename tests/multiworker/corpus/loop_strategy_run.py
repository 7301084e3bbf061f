"""TensorFlow's "Custom training with tf.distribute.Strategy" tutorial, in small: MirroredStrategy,
experimental_distribute_dataset, strategy.run, strategy.reduce(SUM) and tf.nn.compute_average_loss over the
global batch, the model and optimizer made in the strategy's scope."""

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(6)
rng = np.random.default_rng(3)
x = rng.standard_normal((512, 12)).astype("float32")
y = (x[:, :3].sum(axis=1) > 0).astype("int64")

strategy = tf.distribute.MirroredStrategy()
BATCH_SIZE_PER_REPLICA = 64
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
train_dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH_SIZE)
train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)

with strategy.scope():
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    optimizer = keras.optimizers.Adam(1e-2)
    train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")


def compute_loss(labels, predictions):
    per_example_loss = loss_object(labels, predictions)
    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)


def train_step(inputs):
    images, labels = inputs
    with tf.GradientTape() as tape:
        predictions = model(images, training=True)
        loss = compute_loss(labels, predictions)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    train_accuracy.update_state(labels, predictions)
    return loss


@tf.function
def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


history = {"loss": []}
for epoch in range(3):
    total_loss, num_batches = 0.0, 0
    for batch in train_dist_dataset:
        total_loss += distributed_train_step(batch)
        num_batches += 1
    history["loss"].append(float(total_loss / num_batches))
    print(f"loop: epoch {epoch} loss {history['loss'][-1]:.6f} accuracy {float(train_accuracy.result()):.4f}")
    train_accuracy.reset_state()
