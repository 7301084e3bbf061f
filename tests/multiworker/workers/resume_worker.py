"""Resuming a 2-worker job from a plain Keras checkpoint with hvdkeras.load_model is exact.

Uninterrupted: 4 epochs. Resumed: 2 epochs, rank 0 saves, every rank loads the file with
hvdkeras.load_model (the optimizer's slots and iterations come back) and trains 2 more epochs.
"""

import os

import numpy as np
from common import max_abs_diff, seed_everything, write_result

import hvdkeras as hvd
from hvdkeras.training import rank_zero
import keras

hvd.init()
RANK = hvd.rank()
OUT = os.environ["HVDKERAS_TEST_OUT"]
rng = np.random.default_rng(9)
x = rng.normal(size=(128, 5)).astype("float32")
y = (x @ rng.normal(size=(5, 1))).astype("float32")
xs, ys = x[RANK::2], y[RANK::2]


def fresh():
    seed_everything(4)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    return model


callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
whole = fresh()
whole.fit(xs, ys, batch_size=8, epochs=4, shuffle=False, verbose=0, callbacks=callbacks)

part = fresh()
part.fit(xs, ys, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
path = os.path.join(OUT, "epoch2.keras")
if RANK == 0:
    part.save(path)
rank_zero.barrier()
resumed = hvd.load_model(path)
resumed.fit(xs, ys, batch_size=8, epochs=4, initial_epoch=2, shuffle=False, verbose=0, callbacks=callbacks)
write_result(RANK, {
    "resumed_vs_whole": max_abs_diff(resumed.get_weights(), whole.get_weights()),
    "iterations": [int(whole.optimizer.iterations), int(resumed.optimizer.iterations)],
    "optimizer_type": type(resumed.optimizer).__name__,
})
