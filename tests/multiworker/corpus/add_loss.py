"""A layer that adds an activity-regularization loss with self.add_loss ("Making new layers and models via
subclassing")."""

import keras
import numpy as np
from keras import layers, ops


class ActivityRegularizationLayer(layers.Layer):
    def __init__(self, rate=1e-2):
        super().__init__()
        self.rate = rate

    def call(self, inputs):
        self.add_loss(self.rate * ops.mean(ops.square(inputs)))
        return inputs


keras.utils.set_random_seed(7)
rng = np.random.default_rng(6)
x = rng.random((1024, 16)).astype("float32")
y = (x[:, :3].argmax(axis=1)).astype("int64")

inputs = keras.Input(shape=(16,))
h = ActivityRegularizationLayer()(layers.Dense(32, activation="relu")(inputs))
outputs = layers.Dense(3)(h)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.RMSprop(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
history = model.fit(x, y, epochs=8, batch_size=32, verbose=2)
