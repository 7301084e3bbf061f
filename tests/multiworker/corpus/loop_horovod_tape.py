"""Horovod's documented TF2 loop with `import hvdkeras as hvd` in place of `import horovod.tensorflow as hvd`:
each worker reads its shard of the data, a tf.function step with DistributedGradientTape, the rate scaled by
the number of workers, and broadcast_variables of the model's and the optimizer's variables after the first
step (opt.variables(), as Keras 2 spelled it)."""

import keras
import numpy as np
import tensorflow as tf

import hvdkeras as hvd

hvd.init()
keras.utils.set_random_seed(9)
rng = np.random.default_rng(6)
x = rng.standard_normal((512, 16)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank()).batch(32)

model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = keras.optimizers.Adam(0.001 * hvd.size())


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        loss_value = loss(labels, model(images, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)
    return loss_value


history = {"loss": []}
for epoch in range(4):
    for batch, (images, labels) in enumerate(dataset):
        training_step(images, labels, epoch == 0 and batch == 0)
    history["loss"].append(float(loss(y, model(x, training=False))))  # the whole data's loss, on every rank
    if hvd.rank() == 0:
        print(f"loop: epoch {epoch} loss {history['loss'][-1]:.6f}")
