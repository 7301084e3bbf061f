"""The reducers on 2 real workers, each training on its own rows: the post-local SGD reducer against the exact
allreduce (period 1 with plain SGD), the ranks between and right after averagings, the warm-up, and its count
of updates saved and loaded with the optimizer; a Reducer of the test's own under DistributedOptimizer."""

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
write_result(RANK, result)
