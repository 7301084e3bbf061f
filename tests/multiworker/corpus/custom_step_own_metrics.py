"""A subclassed model (no Input) whose train_step keeps its own loss tracker and metric, compiled with an
optimizer only ("Going lower-level" in "Customizing what happens in fit()")."""

import keras
import numpy as np
import tensorflow as tf


class CustomModel(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(1)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    def call(self, x):
        return self.out(self.hidden(x))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.loss_fn(y, y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


keras.utils.set_random_seed(2)
rng = np.random.default_rng(1)
x = rng.standard_normal((1024, 32)).astype("float32")
y = (x @ rng.random((32, 1)) / 4 + 0.1 * rng.standard_normal((1024, 1))).astype("float32")

model = CustomModel()
model.compile(optimizer=keras.optimizers.Adam(1e-2))
history = model.fit(x, y, epochs=8, batch_size=32, verbose=2)
