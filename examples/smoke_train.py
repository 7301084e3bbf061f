"""A 2-worker smoke training run on synthetic data (used until the digits examples exist).

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/smoke_train.py
"""

import keras
import numpy as np

import hvdkeras as hvd

hvd.init()
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1)) > 0).astype("float32")
x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]

keras.utils.set_random_seed(hvd.rank())  # different starting weights: the broadcast makes them equal
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_learning_rate(0.01))),
              loss="binary_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=5, verbose=2 if hvd.rank() == 0 else 0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])
if hvd.rank() == 0:
    print(f"final accuracy over both workers: {history.history['accuracy'][-1]:.3f}")
