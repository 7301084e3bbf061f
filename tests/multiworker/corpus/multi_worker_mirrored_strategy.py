"""tf.distribute.MultiWorkerMirroredStrategy as in TensorFlow's "Multi-worker training with Keras": the global
batch from num_replicas_in_sync, a repeated dataset with steps_per_epoch, the model compiled in the scope."""

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(33)
rng = np.random.default_rng(32)
x = rng.random((1024, 16)).astype("float32")
y = (x[:, :4].argmax(axis=1)).astype("int64")

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = 32 * strategy.num_replicas_in_sync
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=1).repeat().batch(global_batch_size)
with strategy.scope():
    model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
history = model.fit(dataset, epochs=4, steps_per_epoch=24, verbose=2)
