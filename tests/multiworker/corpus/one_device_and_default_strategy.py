"""tf.distribute.get_strategy() (the default strategy, as scripts that fall back from a TPU use it) and a
OneDeviceStrategy on the process's first device, each with a model built and compiled in its scope."""

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(35)
rng = np.random.default_rng(34)
x = rng.random((768, 12)).astype("float32")
y = (x[:, :3].sum(axis=1) > 1.5).astype("float32")


def build_and_fit(strategy):
    print(f"{type(strategy).__name__}: {strategy.num_replicas_in_sync} replica(s)")
    batch_size = 32 * strategy.num_replicas_in_sync
    with strategy.scope():
        model = keras.Sequential([keras.Input(shape=(12,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.Adam(5e-3), loss="binary_crossentropy", metrics=["accuracy"])
    return model, model.fit(x, y, batch_size=batch_size, epochs=4, verbose=2)


model, history = build_and_fit(tf.distribute.get_strategy())
device = "/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"
model, history = build_and_fit(tf.distribute.OneDeviceStrategy(device))
