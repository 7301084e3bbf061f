"""A LearningRateSchedule (ExponentialDecay) given to the optimizer."""

import keras
import numpy as np

keras.utils.set_random_seed(19)
rng = np.random.default_rng(18)
x = rng.random((1024, 16)).astype("float32")
y = (x[:, :4].argmax(axis=1)).astype("int64")

schedule = keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=16, decay_rate=0.8)
model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(4, activation="softmax")])
model.compile(optimizer=keras.optimizers.Adam(schedule), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=8, verbose=2)
