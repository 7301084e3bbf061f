"""The explicit API inside a tf.distribute strategy's scope, on real workers.

Each worker makes a MirroredStrategy over its own device (one CPU) and, in its scope, a model compiled with
hvdkeras.DistributedOptimizer around Adam. It trains on its shard of the data, batches of 16, with the
broadcast and metric callbacks. Every worker also trains, without hvdkeras, the same model on all the data in
batches of 32: the two workers together must train exactly as that one process (the same global batches).
The learning rate is read and set through the strategy's variable by a warm-up callback in a second fit.
"""

import numpy as np
import tensorflow as tf
from common import max_abs_diff, seed_everything, weights_digest, write_result

import hvdkeras as hvd
from hvdkeras.training.learning_rate import as_float
import keras

if not hvd.is_initialized():
    hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
rng = np.random.default_rng(5)
x = rng.normal(size=(256, 6)).astype("float32")
y = (x[:, :2].sum(axis=1) > 0).astype("int64")


def build():
    seed_everything(9)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    return model


loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
reference = build()
reference.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
reference.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)

strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = build()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(1e-2)), loss=loss)
shard = hvd.data.shard(tf.data.Dataset.from_tensor_slices((x, y))).batch(32 // SIZE)
history = model.fit(shard, epochs=2, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                                            hvd.callbacks.MetricAverageCallback()])
result = {"rank": RANK, "strategy": type(strategy).__name__, "replicas": strategy.num_replicas_in_sync,
          "lr_variable": type(model.optimizer.inner_optimizer._learning_rate.value).__name__,
          "vs_one_process": max_abs_diff(model.get_weights(), reference.get_weights()),
          "digest": weights_digest(model.get_weights())}
warmup = hvd.callbacks.LearningRateWarmupCallback(2e-2, warmup_epochs=1)
model.fit(shard, epochs=1, verbose=0, callbacks=[warmup, hvd.callbacks.MetricAverageCallback()])
result["lr_after_warmup"] = as_float(model.optimizer.learning_rate)
result["second_digest"] = weights_digest(model.get_weights())
write_result(RANK, result)
