"""ReduceLROnPlateau halving the learning rate when the validation loss stops improving."""

import keras
import numpy as np

keras.utils.set_random_seed(12)
rng = np.random.default_rng(11)
x = rng.random((1280, 8)).astype("float32")
y = (x @ rng.random((8, 1)) + 0.1 * rng.standard_normal((1280, 1))).astype("float32")

model = keras.Sequential([keras.Input(shape=(8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
reduce_lr = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1, min_delta=1e-3, verbose=1)
history = model.fit(x, y, batch_size=32, epochs=12, validation_split=0.2, callbacks=[reduce_lr], verbose=2)
print("learning rates", [round(float(v), 6) for v in history.history["learning_rate"]])
