"""A loss computed inside the model and compile() given no loss: an endpoint layer takes the targets as an
input and adds the loss with add_loss ("The Functional API" / "endpoint layer pattern")."""

import keras
import numpy as np
from keras import layers, ops


class LogisticEndpoint(layers.Layer):
    def call(self, targets, logits, sample_weights=None):
        self.add_loss(ops.mean(keras.losses.binary_crossentropy(targets, logits, from_logits=True)))
        return ops.sigmoid(logits)


keras.utils.set_random_seed(23)
rng = np.random.default_rng(22)
x = rng.random((1024, 10)).astype("float32")
targets = (x[:, :3].sum(axis=1, keepdims=True) > 1.5).astype("float32")

inputs = keras.Input(shape=(10,), name="inputs")
target_input = keras.Input(shape=(1,), name="targets")
logits = layers.Dense(1)(layers.Dense(16, activation="relu")(inputs))
predictions = LogisticEndpoint(name="predictions")(target_input, logits)
model = keras.Model(inputs=[inputs, target_input], outputs=predictions)
model.compile(optimizer=keras.optimizers.Adam(3e-3))
model.summary()
history = model.fit({"inputs": x, "targets": targets}, batch_size=32, epochs=8, verbose=2)
