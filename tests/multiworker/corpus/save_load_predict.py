"""model.save and save_weights after training, then load_model, predict and load_weights."""

import keras
import numpy as np

keras.utils.set_random_seed(20)
rng = np.random.default_rng(19)
x = rng.random((1024, 16)).astype("float32")
y = (x[:, :2].sum(axis=1) > 1).astype("float32")

model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=8, verbose=2)
model.save("classifier.keras")
model.save_weights("classifier.weights.h5")

reloaded = keras.models.load_model("classifier.keras")
predictions = reloaded.predict(x[:256], batch_size=64)
print(f"agreement with the trained model: {np.mean((predictions > 0.5) == (model.predict(x[:256]) > 0.5)):.3f}")
reloaded.load_weights("classifier.weights.h5")
