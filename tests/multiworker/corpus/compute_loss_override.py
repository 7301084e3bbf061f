"""A functional model subclass that overrides compute_loss to add a penalty on its outputs."""

import keras
import numpy as np
from keras import ops


class PenalizedModel(keras.Model):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
        return loss + 1e-3 * ops.mean(ops.square(y_pred))


keras.utils.set_random_seed(6)
rng = np.random.default_rng(5)
x = rng.random((1024, 20)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 10).astype("float32")

inputs = keras.Input(shape=(20,))
outputs = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(16, activation="relu")(inputs))
model = PenalizedModel(inputs, outputs)
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, epochs=8, batch_size=32, verbose=2)
