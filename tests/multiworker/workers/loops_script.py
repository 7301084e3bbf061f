"""An unmodified script with its own training loops, run by `hvdkeras run -np 2` (test_loops_2w.py).

Each rank seeds itself differently, as an unseeded script does in effect, and feeds rank-dependent data, so
that without hvdkeras the two ranks would train two different models. Writes rank<R>.json into the folder
given as the first argument: the weights' digest of each loop's model, and what happened.
"""

import hashlib
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

rank = int(os.environ.get("HOROVOD_RANK", "0"))
out = sys.argv[1]
keras.utils.set_random_seed(100 + rank)
rng = np.random.default_rng(rank)
result = {}


def digest(variables):
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(np.asarray(v)).tobytes())
    return h.hexdigest()


def make():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dropout(0.3), keras.layers.Dense(1)])


x, y = rng.standard_normal((128, 8)).astype("float32"), rng.standard_normal((128, 1)).astype("float32")

# 0. a loop over NumPy slices first: hvdkeras cannot split it, says so once, and the job still trains one model
model, opt = make(), keras.optimizers.SGD(0.05)
for start in range(0, 64, 16):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x[start:start + 16], training=True) - y[start:start + 16]))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
result["numpy_weights"] = digest(model.get_weights())

# The same data on every rank from here on for the split: each worker takes its rows of every batch, and the
# Keras metrics the script reads are the whole batches'.
shared = np.arange(96, dtype="float32").reshape(48, 2)
rows, seen, mean = [], keras.metrics.Sum(), keras.metrics.Mean()
for batch in tf.data.Dataset.from_tensor_slices(shared).batch(16):
    rows.append(int(batch.shape[0]))
    seen.update_state(float(batch.shape[0]))
    mean.update_state(batch)
result["split_rows"] = rows
result["split_global_rows"] = float(seen.result())
result["split_global_mean"] = float(mean.result())
result["split_own_rows"] = float(seen.total.numpy())  # the state itself stays this worker's

# 1. a tf.function loop with Adam and dropout, on data that differs by rank
model, opt = make(), keras.optimizers.Adam(1e-2)


@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


for xb, yb in tf.data.Dataset.from_tensor_slices((x, y)).batch(32):
    step(xb, yb)
result["tf_function_weights"] = digest(model.get_weights())
result["tf_function_opt"] = digest(opt.variables)

# 2. an eager loop calling optimizer.apply with global-norm clipping in the optimizer
model, opt = make(), keras.optimizers.SGD(0.1, global_clipnorm=0.5)
for xb, yb in tf.data.Dataset.from_tensor_slices((x, y)).batch(64):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
result["eager_weights"] = digest(model.get_weights())

# 3. mixed_float16: rank 1's gradients overflow on the second step; both ranks skip it together
keras.mixed_precision.set_global_policy("mixed_float16")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1, dtype="float32")])
opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
scales = []
for i in range(3):
    blow_up = 1e30 if (i == 1 and rank == 1) else 1.0
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x[:16]) * blow_up)
        scaled = opt.scale_loss(loss)
    opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
    scales.append(float(opt.dynamic_scale))
result["mixed_scales"] = scales
result["mixed_weights"] = digest(model.get_weights())
result["mixed_iterations"] = int(opt.inner_optimizer.iterations.numpy())
keras.mixed_precision.set_global_policy("float32")

# 4. train_on_batch on a compiled model, without fit
model = make()
model.compile(optimizer="adam", loss="mse")
for i in range(3):
    model.train_on_batch(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16])
result["train_on_batch_weights"] = digest(model.get_weights())

# 5. a step compiled with XLA that applies the gradients: one clear error, not a crash inside XLA
model, opt = make(), keras.optimizers.SGD(0.1)


@tf.function(jit_compile=True)
def xla_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


try:
    xla_step(x[:8], y[:8])
    result["xla_error"] = None
except RuntimeError as error:
    result["xla_error"] = str(error)

with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
