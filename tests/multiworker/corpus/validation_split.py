"""Holding out the last 20% of the arrays for validation with validation_split."""

import keras
import numpy as np

keras.utils.set_random_seed(10)
rng = np.random.default_rng(9)
x = rng.random((1280, 16)).astype("float32")
y = (x[:, :2].sum(axis=1) > 1).astype("float32")

model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=8, validation_split=0.2, verbose=2)
print(f"val_accuracy {history.history['val_accuracy'][-1]:.4f}")
