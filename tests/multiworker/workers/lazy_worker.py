"""Lazily built models on real workers: no Input layer, and a subclassed model.

Each rank starts from its own seed; BroadcastGlobalVariablesCallback must make step 1 start from rank 0's
weights although Keras builds these models only inside the first traced step. Then Horovod's Keras MNIST
example in miniature: Sequential without Input, broadcast, exact metrics, warm-up, rank-0 checkpoint.
"""

import os

import numpy as np
from common import max_abs_diff, seed_everything, weights_digest, write_result

import hvdkeras as hvd
import keras

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
OUT = os.environ["HVDKERAS_TEST_OUT"]
B = 8
result = {"rank": RANK}


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))


def lazy_model(kind, seed):
    seed_everything(seed)
    if kind == "sequential":
        return keras.Sequential([keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    return Subclassed()


rng = np.random.default_rng(5)
x = rng.normal(size=(6 * B * SIZE, 4)).astype("float32")
y = (x[:, :1] - 0.3 * x[:, 1:2]).astype("float32")
g = B * SIZE
rows = np.concatenate([np.arange(k * g + RANK * B, k * g + (RANK + 1) * B) for k in range(len(x) // g)])

for kind in ("sequential", "subclassed"):
    model = lazy_model(kind, 100 + RANK)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    assert not model.built
    model.fit(x[rows], y[rows], batch_size=B, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    ref = lazy_model(kind, 100)  # rank 0's initial weights, trained alone on the global batches
    ref.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    ref.fit(x, y, batch_size=g, shuffle=False, verbose=0)
    result[f"{kind}_max_abs_diff"] = max_abs_diff(model.get_weights(), ref.get_weights())
    result[f"{kind}_digest"] = weights_digest(model.get_weights())
    result[f"{kind}_iterations"] = int(model.optimizer.iterations.numpy())
    # A second fit of the now built model takes the ordinary path.
    model.fit(x[rows], y[rows], batch_size=B, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    result[f"{kind}_second_digest"] = weights_digest(model.get_weights())

# Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py, in miniature (same-shaped random images).
images = np.random.default_rng(1).random((SIZE * 64, 28, 28, 1)).astype("float32")
labels = np.random.default_rng(2).integers(0, 10, SIZE * 64)
seed_everything(200 + RANK)
mnist = keras.Sequential([
    keras.layers.Conv2D(8, [3, 3], activation="relu"),
    keras.layers.MaxPooling2D(pool_size=(2, 2)),
    keras.layers.Flatten(),
    keras.layers.Dense(16, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
scaled_lr = 0.001 * hvd.size()
mnist.compile(loss=keras.losses.SparseCategoricalCrossentropy(), optimizer=hvd.DistributedOptimizer(
    keras.optimizers.Adam(scaled_lr)), metrics=["accuracy"])
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=0),
]
if RANK == 0:
    callbacks.append(keras.callbacks.ModelCheckpoint(os.path.join(OUT, "checkpoint-{epoch}.keras")))
history = mnist.fit(images[RANK::SIZE], labels[RANK::SIZE], batch_size=16, epochs=2, callbacks=callbacks,
                    verbose=0)
result["mnist_digest"] = weights_digest(mnist.get_weights())
result["mnist_accuracy"] = history.history["accuracy"]
write_result(RANK, result)
