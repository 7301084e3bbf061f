"""An Embedding and a bidirectional LSTM on integer sequences ("Bidirectional LSTM on IMDB", on synthetic
sequences): the embedding's gradients are IndexedSlices."""

import keras
import numpy as np
from keras import layers

keras.utils.set_random_seed(25)
rng = np.random.default_rng(24)
max_features, maxlen = 200, 20
x = rng.integers(1, max_features, size=(512, maxlen)).astype("int32")
y = (np.isin(x, np.arange(1, 20)).sum(axis=1) > 1).astype("int32")

inputs = keras.Input(shape=(None,), dtype="int32")
h = layers.Embedding(max_features, 16)(inputs)
h = layers.Bidirectional(layers.LSTM(8))(h)
outputs = layers.Dense(1, activation="sigmoid")(h)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=["accuracy"])
model.summary()
history = model.fit(x, y, batch_size=32, epochs=4, verbose=2)
