"""The Keras guide "Multi-GPU distributed training with TensorFlow": a MirroredStrategy, the model built and
compiled in strategy.scope(), a checkpoint every epoch, then the latest checkpoint restored with
keras.models.load_model inside the scope and trained further."""

import glob
import os

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(21)
rng = np.random.default_rng(20)
x = rng.random((1024, 16)).astype("float32")
y = (x[:, :4].argmax(axis=1)).astype("int64")

strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")
BATCH_SIZE_PER_REPLICA = 32
batch_size = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
# The guide creates this folder first on every process; ModelCheckpoint creates it where it writes (rank 0).
checkpoint_dir = "./ckpt"


def get_compiled_model():
    model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy()])
    return model


def make_or_restore_model():
    checkpoints = glob.glob(os.path.join(checkpoint_dir, "ckpt-*.keras"))
    if checkpoints:
        latest = max(checkpoints, key=os.path.getmtime)
        print("Restoring from", latest)
        return keras.models.load_model(latest)
    print("Creating a new model")
    return get_compiled_model()


def run_training(epochs):
    with strategy.scope():
        model = make_or_restore_model()
    model.summary()
    train = tf.data.Dataset.from_tensor_slices((x[:768], y[:768])).batch(batch_size)
    val = tf.data.Dataset.from_tensor_slices((x[768:], y[768:])).batch(batch_size)
    callbacks = [keras.callbacks.ModelCheckpoint(filepath=os.path.join(checkpoint_dir, "ckpt-{epoch}.keras"),
                                                 save_freq="epoch")]
    return model, model.fit(train, epochs=epochs, callbacks=callbacks, validation_data=val, verbose=2)


model, history = run_training(epochs=4)
model, history = run_training(epochs=3)
