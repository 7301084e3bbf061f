"""The reducers on 2 real workers, each training on its own rows: post-local SGD, DiLoCo and PowerSGD against the
exact allreduce (their equivalent settings), the ranks between and right after synchronisations, warm-ups and
start steps, fp16 with PowerSGD, each resumed bit for bit from a checkpoint, and BatchNormalization's statistics
averaged at each synchronisation."""

import os

import numpy as np

from common import max_abs_diff, out_dir, seed_everything, weights_digest, write_result

import hvdkeras as hvd  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()
RANK = hvd.rank()
STEPS, B = 6, 8


def model(seed=0):
    seed_everything(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)])


def my_rows(seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(STEPS * B * 2, 5)).astype("float32")
    y = np.stack([x[:, 0] - x[:, 1], x[:, 2] * x[:, 3], np.cos(x[:, 4])], axis=1).astype("float32")
    return x[RANK::2], y[RANK::2]  # each worker its own, different rows


def train(reducer, steps=STEPS, traced=True, optimizer=None, broadcast=True):
    """`steps` updates with the reducer (None: the default allreduce); the weights digest after each update.
    Without `broadcast` each rank starts from weights of its own."""
    net = model(seed=0 if broadcast else 10 + RANK)
    opt = hvd.DistributedOptimizer(optimizer or keras.optimizers.SGD(0.1), reducer=reducer)
    x, y = my_rows()
    if broadcast:
        hvd.broadcast_variables(net.variables, root_rank=0)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(net(xb) - yb))
        opt.apply(tape.gradient(loss, net.trainable_variables), net.trainable_variables)

    run = tf.function(step) if traced else step
    digests = []
    for k in range(steps):
        run(x[k * B:(k + 1) * B], y[k * B:(k + 1) * B])
        digests.append(weights_digest(net.trainable_variables))
    return net, opt, digests


result = {}
# Period 1 with plain SGD: the exact allreduce, to float tolerance (traced and eager).
exact, _, _ = train(None)
for traced in (True, False):
    local, _, digests = train(hvd.reduce.LocalSGDReducer(period=1), traced=traced)
    result[f"period1_traced{traced}_max_abs_diff"] = max_abs_diff(
        [v.numpy() for v in local.trainable_variables], [v.numpy() for v in exact.trainable_variables])
    result[f"period1_traced{traced}_digests"] = digests
# Period 3: the copies differ between averagings and are identical right after each (updates 3 and 6).
_, opt3, digests = train(hvd.reduce.LocalSGDReducer(period=3), optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
result["period3_digests"] = digests
result["period3_updates"] = int(opt3.reducer.steps.numpy())
# A warm-up of 2 exact updates, then period 2: identical after updates 1, 2 (exact), 4 and 6 (averaged).
_, _, digests = train(hvd.reduce.LocalSGDReducer(period=2, warmup_steps=2))
result["warmup_digests"] = digests
# DiLoCo with period 1, outer rate 1 and no momentum: the plain average every update, so the exact allreduce.
diloco, opt, digests = train(hvd.reduce.DiLoCoReducer(period=1, outer_learning_rate=1.0, outer_momentum=0.0))
result["diloco1_max_abs_diff"] = max_abs_diff([v.numpy() for v in diloco.trainable_variables],
                                              [v.numpy() for v in exact.trainable_variables])
result["diloco1_digests"] = digests
# The paper's outer optimizer, period 3, ranks that start from weights of their own (no broadcast): identical
# right after each synchronisation (updates 3 and 6) only; the state has the anchors and momenta.
_, opt, digests = train(hvd.reduce.DiLoCoReducer(period=3), optimizer=keras.optimizers.Adam(0.01), broadcast=False)
result["diloco3_digests"] = digests
result["diloco3_state"] = len(opt.reducer.state())
result["diloco3_anchor_digest"] = weights_digest(opt.reducer.anchors)
# The count of updates is saved with the optimizer and loaded back.
net = model()
net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                               reducer=hvd.reduce.LocalSGDReducer(period=2)), loss="mse")
x, y = my_rows()
net.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False)
path = os.path.join(out_dir(), f"local_sgd_rank{RANK}.weights.h5")
net.save_weights(path)
again = model()
again.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                 reducer=hvd.reduce.LocalSGDReducer(period=2)), loss="mse")
again.fit(x[:B], y[:B], batch_size=B, epochs=1, verbose=0)
again.load_weights(path)
result["saved_updates"] = int(net.optimizer.reducer.steps.numpy())
result["loaded_updates"] = int(again.optimizer.reducer.steps.numpy())
result["fit_digest"] = weights_digest(net.trainable_variables)  # 6 updates, period 2: averaged at the end

# PowerSGD with a rank at least each kernel's smaller side (5x16, 16x3), every matrix compressed from the first
# step: the exact allreduce, to float tolerance.
full, _, digests = train(hvd.reduce.PowerSGDReducer(rank=5, start_step=0, min_compression_rate=0))
result["powersgd_full_max_abs_diff"] = max_abs_diff([v.numpy() for v in full.trainable_variables],
                                                    [v.numpy() for v in exact.trainable_variables])
result["powersgd_full_digests"] = digests
# Rank 1 after 2 exact steps: the same as the allreduce for those two, apart after; the ranks identical always.
_, _, exact_digests = train(None)
result["exact_digests"] = exact_digests
low, _, digests = train(hvd.reduce.PowerSGDReducer(rank=1, start_step=2, min_compression_rate=0))
result["powersgd_rank1_digests"] = digests
# fp16 composes: P and Q sent as float16; the ranks identical, close to the float32 run.
net16 = model()
opt16 = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=hvd.Compression.fp16,
                                 reducer=hvd.reduce.PowerSGDReducer(rank=1, start_step=2, min_compression_rate=0))
hvd.broadcast_variables(net16.variables, root_rank=0)
xs, ys = my_rows()
fp16_digests = []


@tf.function
def step16(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(net16(xb) - yb))
    opt16.apply(tape.gradient(loss, net16.trainable_variables), net16.trainable_variables)


for k in range(STEPS):
    step16(xs[k * B:(k + 1) * B], ys[k * B:(k + 1) * B])
    fp16_digests.append(weights_digest(net16.trainable_variables))
result["powersgd_fp16_digests"] = fp16_digests
result["powersgd_fp16_max_abs_diff"] = max_abs_diff([v.numpy() for v in net16.trainable_variables],
                                                    [v.numpy() for v in low.trainable_variables])

# PowerSGD on a DistributedGradientTape (made once, passed to each step's tape): the exact allreduce with a full
# rank, and the ranks identical with rank 1.


def tape_train(reducer):
    net = model()
    opt = keras.optimizers.SGD(0.1)
    xs, ys = my_rows()

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(net(xb) - yb))
        grads = hvd.DistributedGradientTape(tape, reducer=reducer).gradient(loss, net.trainable_variables)
        opt.apply(grads, net.trainable_variables)

    digests = []
    for k in range(STEPS):
        step(xs[k * B:(k + 1) * B], ys[k * B:(k + 1) * B])
        digests.append(weights_digest(net.trainable_variables))
    return net, digests


tape_full, result["tape_full_digests"] = tape_train(hvd.reduce.PowerSGDReducer(rank=5, start_step=0,
                                                                                min_compression_rate=0))
result["tape_full_max_abs_diff"] = max_abs_diff([v.numpy() for v in tape_full.trainable_variables],
                                                [v.numpy() for v in exact.trainable_variables])
_, result["tape_rank1_digests"] = tape_train(hvd.reduce.PowerSGDReducer(rank=1, start_step=1, min_compression_rate=0))

# Resumed from a checkpoint (hvdkeras's ModelCheckpoint, rank 0 writing every worker's state), each reducer
# continues bit for bit: 2 epochs of 3 updates, against epoch 1's checkpoint loaded by a new model and a
# second epoch.
RESUMABLE = {
    "powersgd": lambda: hvd.reduce.PowerSGDReducer(rank=1, start_step=1, min_compression_rate=0),
    "local_sgd": lambda: hvd.reduce.LocalSGDReducer(period=3),
    "diloco": lambda: hvd.reduce.DiLoCoReducer(period=3),
}
x, y = my_rows()
x, y = x[:3 * B], y[:3 * B]
for label, make in RESUMABLE.items():
    def compiled(make=make):
        net = model()
        net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), reducer=make()),
                    loss="mse")
        return net

    path = os.path.join(out_dir(), f"resume_{label}_{{epoch}}.weights.h5")
    whole = compiled()
    whole.fit(x, y, batch_size=B, epochs=2, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    resumed = compiled()
    resumed.fit(x[:B], y[:B], batch_size=B, epochs=1, verbose=0)  # builds the optimizer, then overwritten
    resumed.load_weights(path.format(epoch=1))
    resumed.fit(x, y, batch_size=B, epochs=2, initial_epoch=1, verbose=0, shuffle=False)
    # The same from a backup: rank 0 alone restores it, and each worker takes its own state from rank 0.
    backup = os.path.join(out_dir(), f"backup_{label}")
    first = compiled()
    first.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    restored = compiled()
    restored.fit(x, y, batch_size=B, epochs=2, verbose=0, shuffle=False,
                 callbacks=[hvd.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    result[f"backup_{label}_resumed"] = weights_digest(restored.trainable_variables + restored.optimizer.variables)
    result[f"resume_{label}_whole"] = weights_digest(whole.trainable_variables + whole.optimizer.variables)
    result[f"resume_{label}_resumed"] = weights_digest(resumed.trainable_variables + resumed.optimizer.variables)
    own = whole.optimizer.reducer.worker_state() or whole.optimizer.inner_optimizer.variables[2:]  # the slots
    result[f"resume_{label}_own_state"] = weights_digest(own)

# BatchNormalization's moving statistics are averaged at each synchronisation of local SGD and DiLoCo (the
# callbacks give the reducer the model's non-trainable variables); a loop that does not pass them keeps each
# worker's own.


def bn_model():
    seed_everything(0)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(16), keras.layers.BatchNormalization(),
                             keras.layers.Dense(3)])


def loop_with_bn(net, reducer):
    """A loop of the script's own that gives the reducer nothing to average besides the updated variables."""
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), reducer=reducer)

    @tf.function
    def bn_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(net(xb, training=True) - yb))
        opt.apply(tape.gradient(loss, net.trainable_variables), net.trainable_variables)

    for k in range(STEPS):
        bn_step(x[k * B:(k + 1) * B], y[k * B:(k + 1) * B])
    return net


x, y = my_rows()
for label, make in (("local_sgd", lambda: hvd.reduce.LocalSGDReducer(period=3)),
                    ("diloco", lambda: hvd.reduce.DiLoCoReducer(period=3))):
    net = bn_model()
    net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), reducer=make()), loss="mse")
    net.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False,
            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    result[f"bn_{label}_stats"] = weights_digest(net.non_trainable_variables)
    result[f"bn_{label}_weights"] = weights_digest(net.trainable_variables)
    result[f"bn_{label}_loop_stats"] = weights_digest(loop_with_bn(bn_model(), make()).non_trainable_variables)
write_result(RANK, result)
