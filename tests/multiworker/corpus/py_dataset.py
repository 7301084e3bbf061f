"""Training from a keras.utils.PyDataset that builds its batches in __getitem__."""

import math

import keras
import numpy as np


class ArrayBatches(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return math.ceil(len(self.x) / self.batch_size)

    def __getitem__(self, idx):
        low = idx * self.batch_size
        high = min(low + self.batch_size, len(self.x))
        return self.x[low:high], self.y[low:high]


keras.utils.set_random_seed(15)
rng = np.random.default_rng(14)
x = rng.random((1024, 16)).astype("float32")
y = (x[:, :4].argmax(axis=1)).astype("int64")

model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(4, activation="softmax")])
model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(ArrayBatches(x, y, batch_size=32), epochs=8, verbose=2)
