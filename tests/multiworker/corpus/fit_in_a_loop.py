"""fit called once per epoch in a Python loop, with an evaluation after each."""

import keras
import numpy as np

keras.utils.set_random_seed(14)
rng = np.random.default_rng(13)
x = rng.random((1024, 16)).astype("float32")
y = (x[:, :2].sum(axis=1) > 1).astype("float32")

model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="binary_crossentropy", metrics=["accuracy"])
for round_ in range(6):
    history = model.fit(x[:768], y[:768], batch_size=32, epochs=1, verbose=2)
    loss, accuracy = model.evaluate(x[768:], y[768:], verbose=0)
    print(f"round {round_}: val loss {loss:.4f}, val accuracy {accuracy:.4f}")
