"""EarlyStopping on the validation loss, restoring the best weights."""

import keras
import numpy as np

keras.utils.set_random_seed(11)
rng = np.random.default_rng(10)
x = rng.random((1024, 8)).astype("float32")
y = (x @ rng.random((8, 1)) + 0.3 * rng.standard_normal((1024, 1))).astype("float32")

model = keras.Sequential([keras.Input(shape=(8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
model.summary()
stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, min_delta=1e-3, restore_best_weights=True,
                                     verbose=1)
history = model.fit(x, y, batch_size=32, epochs=80, validation_split=0.25, callbacks=[stop], verbose=2)
print(f"stopped after {len(history.history['loss'])} epochs")
