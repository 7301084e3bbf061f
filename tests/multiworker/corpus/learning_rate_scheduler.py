"""LearningRateScheduler: the learning rate as a function of the epoch and the current rate."""

import keras
import numpy as np


def scheduler(epoch, lr):
    return lr if epoch < 3 else lr * 0.7


keras.utils.set_random_seed(17)
rng = np.random.default_rng(16)
x = rng.random((1024, 16)).astype("float32")
y = (x[:, :4].argmax(axis=1)).astype("int64")

model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(4, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=8, callbacks=[keras.callbacks.LearningRateScheduler(scheduler)],
                    verbose=2)
print("learning rates", [round(float(v), 6) for v in history.history["learning_rate"]])
