"""Models with their own train_step on real workers, through the explicit API.

Each rank starts from its own seed. A custom train_step and test_step, a compute_loss override and an
autoencoder with no call() whose sub-models Keras builds only inside the first traced step must all train
like one process on the global batch from rank 0's weights. A GAN (two optimizers held by the model) keeps
both ranks identical with DistributedOptimizers and fails after its first epoch, naming the optimizers,
without them. A model that cannot be built before its first step fails with hvdkeras's message.
"""

import numpy as np
import tensorflow as tf
from common import max_abs_diff, seed_everything, weights_digest, write_result

import hvdkeras as hvd
import keras

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
B = 8
G = B * SIZE
result = {"rank": RANK}

rng = np.random.default_rng(7)
x = rng.normal(size=(6 * G, 6)).astype("float32")
y = (x[:, :1] - 0.5 * x[:, 1:2]).astype("float32")
rows = np.concatenate([np.arange(k * G + RANK * B, k * G + (RANK + 1) * B) for k in range(len(x) // G)])


class CustomStep(keras.Model):
    """The guide's custom train_step and test_step."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        for metric in self.metrics:
            metric.update_state(loss) if metric.name == "loss" else metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        for metric in self.metrics:
            metric.update_state(loss) if metric.name == "loss" else metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


class Penalized(keras.Model):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
        return loss + 0.01 * tf.reduce_mean(tf.square(y_pred))


class AutoEncoder(keras.Model):
    """No call(): the encoder and decoder have no Input, so their variables appear in the first trace."""

    def __init__(self):
        super().__init__()
        self.encoder = keras.Sequential([keras.layers.Dense(3, activation="tanh")])
        self.decoder = keras.Sequential([keras.layers.Dense(6)])
        self.loss_tracker = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        return [self.loss_tracker]

    def train_step(self, data):
        x, _ = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self.decoder(self.encoder(x)) - x))
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}


def functional(cls, seed):
    seed_everything(seed)
    inputs = keras.Input((6,))
    return cls(inputs, keras.layers.Dense(1)(keras.layers.Dense(4, activation="tanh")(inputs)))


def make(kind, seed):
    if kind == "custom_step":
        return functional(CustomStep, seed)
    if kind == "compute_loss":
        return functional(Penalized, seed)
    seed_everything(seed)
    return AutoEncoder()


for kind in ("custom_step", "compute_loss", "autoencoder"):
    metrics = ["mae"] if kind == "custom_step" else None
    loss = None if kind == "autoencoder" else "mse"
    model = make(kind, 100 + RANK)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss=loss, metrics=metrics)
    validation = (x[rows], y[rows]) if kind == "custom_step" else None
    history = model.fit(x[rows], y[rows], batch_size=B, epochs=2, shuffle=False, verbose=0,
                        validation_data=validation,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    ref = make(kind, 100)  # rank 0's initial weights, trained alone on the global batches
    ref.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss, metrics=metrics)
    ref_history = ref.fit(x, y, batch_size=G, epochs=2, shuffle=False, verbose=0,
                          validation_data=(x, y) if validation else None)
    result[f"{kind}_max_abs_diff"] = max_abs_diff(model.get_weights(), ref.get_weights())
    result[f"{kind}_digest"] = weights_digest(model.get_weights())
    result[f"{kind}_logs"] = {k: [float(v) for v in vs] for k, vs in history.history.items()}
    result[f"{kind}_one_process_logs"] = {k: [float(v) for v in vs] for k, vs in ref_history.history.items()}


class GAN(keras.Model):
    def __init__(self):
        super().__init__()
        self.discriminator = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                               keras.layers.Dense(1)], name="discriminator")
        self.generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(6)], name="generator")
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def train_step(self, data):
        real, _ = data
        n = tf.shape(real)[0]
        fake = self.generator(keras.random.normal((n, 2), seed=self.seed_generator))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(tf.concat([fake, real], axis=0))
            d_loss = self.loss_fn(tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], axis=0), predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            fake = self.generator(keras.random.normal((n, 2), seed=self.seed_generator))
            g_loss = self.loss_fn(tf.zeros((n, 1)), self.discriminator(fake))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        return {"d_loss": d_loss, "g_loss": g_loss}


def gan(distributed):
    seed_everything(300 + RANK)
    model = GAN()
    wrap = hvd.DistributedOptimizer if distributed else (lambda opt: opt)
    model.compile(d_optimizer=wrap(keras.optimizers.Adam(1e-3)), g_optimizer=wrap(keras.optimizers.Adam(1e-3)))
    history = model.fit(x[rows], y[rows], batch_size=B, epochs=2, shuffle=False, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    return model, history


model, history = gan(distributed=True)
result["gan_digest"] = weights_digest(model.get_weights())
result["gan_logs"] = {k: [float(v) for v in vs] for k, vs in history.history.items()}
try:
    gan(distributed=False)
    result["gan_undistributed_error"] = None
except RuntimeError as err:
    result["gan_undistributed_error"] = str(err)


class NotTraceable(keras.Model):
    """A step that needs eager tensors (`.numpy()`), run eagerly: it cannot be traced ahead of step 1."""

    def __init__(self):
        super().__init__(name="not_traceable")
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        scale = float(tf.reduce_mean(x).numpy())
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x) * scale - y))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


seed_everything(400)
model = NotTraceable()
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), run_eagerly=True)
try:
    model.fit(x[rows], y[rows], batch_size=B, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    result["not_traceable_error"] = None
except RuntimeError as err:
    result["not_traceable_error"] = str(err)
model(x[:1])  # what the message says to do: then its variables are broadcast as they are
model.fit(x[rows], y[rows], batch_size=B, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
result["not_traceable_digest"] = weights_digest(model.get_weights())
write_result(RANK, result)
