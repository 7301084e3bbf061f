"""A functional model with its own train_step and test_step ("Customizing what happens in fit()")."""

import keras
import numpy as np
import tensorflow as tf


class CustomModel(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
x = rng.standard_normal((1024, 32)).astype("float32")
y = (x @ rng.random((32, 1)) / 4 + 0.1 * rng.standard_normal((1024, 1))).astype("float32")

inputs = keras.Input(shape=(32,))
outputs = keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(inputs))
model = CustomModel(inputs, outputs)
model.compile(optimizer="adam", loss="mse", metrics=["mae"])
history = model.fit(x[:768], y[:768], epochs=8, validation_data=(x[768:], y[768:]), verbose=2)
print(model.evaluate(x[768:], y[768:], return_dict=True, verbose=0))
