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

# 6-8. strategy.run loops: the workers are more replicas of the script's strategy. The same data on every rank;
# a linear model trained by SGD, its weights and losses checked against one process's, computed here in NumPy.
feats = np.linspace(-1.0, 1.0, 45 * 3, dtype="float32").reshape(45, 3)
target = (feats @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.1).astype("float32")


def one_process(batches, lr=0.1):
    """One process's SGD on the global batches: its weights and each step's mean loss."""
    w, losses = np.zeros((3, 1), "float64"), []
    for rows in batches:
        xb, yb = feats[rows].astype("float64"), target[rows].astype("float64")
        err = xb @ w - yb
        losses.append(float(np.mean(err ** 2)))
        w -= lr * 2.0 * xb.T @ err / len(rows)
    return w, losses


def linear():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])


# 6. MirroredStrategy, experimental_distribute_dataset, a Keras loss (divided by the replicas), reduce(SUM), eager
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model, opt, mse = linear(), keras.optimizers.SGD(0.1), keras.losses.MeanSquaredError()


def replica_step(inputs):
    xb, yb = inputs
    with tf.GradientTape() as tape:
        loss = mse(yb, model(xb))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss, tf.shape(xb)[0]


losses, rows = [], []
first_32 = tf.data.Dataset.from_tensor_slices((feats[:32], target[:32])).batch(16)
for batch in strategy.experimental_distribute_dataset(first_32):
    loss, n = strategy.run(replica_step, args=(batch,))
    losses.append(float(strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)))
    rows.append([int(v) for v in strategy.experimental_local_results(n)])
w, expected = one_process([range(0, 16), range(16, 32)])
result["mirrored"] = {"rows": rows, "losses": losses, "expected_losses": expected,
                      "weights": model.get_weights()[0].ravel().tolist(), "expected_weights": w.ravel().tolist()}

# 7. the default strategy, distribute_datasets_from_function sharding by the input context, in a tf.function:
# compute_average_loss's default global batch, reduce(MEAN, axis=0) over every row, an uneven last batch
strategy = tf.distribute.get_strategy()
model, opt = linear(), keras.optimizers.SGD(0.1)
contexts = []


def dataset_fn(context):
    contexts.append([context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync,
                     context.get_per_replica_batch_size(16)])
    dataset = tf.data.Dataset.from_tensor_slices((feats, target))
    dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
    return dataset.batch(context.get_per_replica_batch_size(16))


def replica_step_2(xb, yb):
    with tf.GradientTape() as tape:
        per_example = tf.reduce_mean(tf.square(model(xb) - yb), axis=1)
        loss = tf.nn.compute_average_loss(per_example)
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return per_example


@tf.function
def distributed_step(xb, yb):
    per_example = strategy.run(replica_step_2, args=(xb, yb))
    return strategy.reduce("MEAN", per_example, axis=0)


losses = [float(distributed_step(xb, yb)) for xb, yb in strategy.distribute_datasets_from_function(dataset_fn)]
w, expected = one_process([range(0, 16), range(16, 32), range(32, 45)])
result["from_function"] = {"contexts": contexts, "losses": losses, "expected_losses": expected,
                           "weights": model.get_weights()[0].ravel().tolist(), "expected_weights": w.ravel().tolist()}

# 8. a loss averaged over the replica's own rows in strategy.run on split data: said once, by rank 0
model, opt = linear(), keras.optimizers.SGD(0.1)


def local_mean_step(inputs):
    xb, yb = inputs
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb) - yb))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


for batch in strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((feats, target)).batch(16)):
    strategy.run(local_mean_step, args=(batch,))
result["local_mean_weights"] = digest(model.get_weights())

with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
