"""A model fitted, used to predict, and fitted again (an autoencoder trained in two rounds, with the
reconstructions of the first round looked at in between)."""

import keras
import numpy as np
from keras import layers

keras.utils.set_random_seed(27)
rng = np.random.default_rng(26)
x = rng.random((1024, 12)).astype("float32")

inputs = keras.Input(shape=(12,))
encoded = layers.Dense(4, activation="relu")(inputs)
decoded = layers.Dense(12, activation="sigmoid")(encoded)
model = keras.Model(inputs, decoded)
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy")
model.summary()
model.fit(x, x, batch_size=32, epochs=4, verbose=2)
reconstructed = model.predict(x[:64], verbose=2)
print(f"reconstruction error after round 1: {float(np.mean((reconstructed - x[:64]) ** 2)):.4f}")
history = model.fit(x, x, batch_size=32, epochs=4, verbose=2)
