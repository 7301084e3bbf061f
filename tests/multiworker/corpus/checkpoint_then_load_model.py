"""ModelCheckpoint keeping the best model during fit, then keras.models.load_model and evaluate, and more
training of the reloaded model."""

import keras
import numpy as np

keras.utils.set_random_seed(13)
rng = np.random.default_rng(12)
x = rng.random((1024, 16)).astype("float32")
y = (x[:, :4].argmax(axis=1)).astype("int64")

model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(4, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
checkpoint = keras.callbacks.ModelCheckpoint("best_model.keras", monitor="val_loss", save_best_only=True)
model.fit(x[:768], y[:768], batch_size=32, epochs=8, validation_data=(x[768:], y[768:]), callbacks=[checkpoint],
          verbose=2)

model = keras.models.load_model("best_model.keras")
loss, accuracy = model.evaluate(x[768:], y[768:], verbose=2)
print(f"best model: loss {loss:.4f}, accuracy {accuracy:.4f}")
history = model.fit(x[:768], y[:768], batch_size=32, epochs=1, verbose=2)
