"""Imbalanced classes: fit with class_weight, then with per-sample weights ("Training & evaluation with the
built-in methods")."""

import keras
import numpy as np

keras.utils.set_random_seed(8)
rng = np.random.default_rng(7)
x = rng.random((1024, 16)).astype("float32")
y = (x[:, 0] > 0.8).astype("int64")  # about 20% of class 1

model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(2, activation="softmax")])
model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy",
              metrics=["sparse_categorical_accuracy"])
model.fit(x, y, class_weight={0: 1.0, 1: 4.0}, batch_size=32, epochs=4, verbose=2)

sample_weight = np.where(y == 1, 4.0, 1.0).astype("float32")
history = model.fit(x, y, sample_weight=sample_weight, batch_size=32, epochs=4, verbose=2)
