"""A plain Keras script (no hvdkeras import) whose model has no Input layer, so Keras builds it lazily.

Each process seeds itself differently (from the launcher's rank variable), as unrelated processes would:
under `python -m hvdkeras` the broadcast must still make every worker start from rank 0's weights.
"""

import os

import keras
import numpy as np

keras.utils.set_random_seed(1 + int(os.environ.get("HOROVOD_RANK", "0")))
rng = np.random.default_rng(3)
x = rng.normal(size=(640, 6)).astype("float32")
y = (x[:, 0] > 0).astype("int64")
model = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2, activation="softmax")])
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, batch_size=32, epochs=2, verbose=2)
