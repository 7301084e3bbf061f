"""One worker of the stall benchmark (benchmarks/stall_benchmark.py), one per test host.

    stall_worker.py OUT_JSON [--runs 20] [--steps 20] [--warmup 5] [--inter-op 0] [--image-size 32] [--batch 64]

Trains the network benchmark's conv model with hvdkeras's DistributedOptimizer (its defaults) in `model.fit`,
in --runs runs of --steps steps, each run starting from an allreduce barrier as a round of the network
benchmark does, and records every step's interval (between Keras's batch-end callbacks). Before the runs it
times, in the same process, the same fit with a plain optimizer (t_local) and the gradients' grouped allreduce
alone (t_comm): a step above t_local + t_comm hid nothing.

Each bucket's gradients are stamped (tf.timestamp, which the bucket's allreduce waits for) when the train step
hands them to Horovod: per step, the order in which this rank handed the buckets over, and when (ms from the
first). Horovod starts a bucket's transfer only once every rank has handed it over, so two ranks that hand
them over in different orders overlap less. Each rank writes OUT_JSON.rankN.
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
import tensorflow as tf
from net_worker import CLASSES, conv_model, grad_bytes, set_threads

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--runs", type=int, default=20)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--inter-op", type=int, default=0, help="inter-op threads; 0: TensorFlow's default")
parser.add_argument("--image-size", type=int, default=32, help="the conv model's input side (16 in the network "
                    "benchmark; 32 quadruples its compute, to about t_comm at 100 Mbit/s)")
parser.add_argument("--batch", type=int, default=64, help="samples per worker and step")
args = parser.parse_args()
set_threads(args.inter_op)

import keras  # noqa: E402

import hvdkeras as hvd  # noqa: E402
from hvdkeras import _collectives as C  # noqa: E402
from hvdkeras.reduce import allreduce as allreduce_module  # noqa: E402

BUCKETS = "hvdkeras.gradients."
# Per bucket, when it was handed over: one variable each, so that automatic control dependencies (which order
# the stateful ops on one resource) do not order the buckets' hand-overs.
STAMPS = [tf.Variable(0.0, dtype=tf.float64, trainable=False) for _ in range(64)]
handed_over = allreduce_module.allreduce_group


def stamped_group(out, indices, options, name):
    """hvdkeras's allreduce of one bucket, after stamping when its gradients were all there."""
    if name.startswith(BUCKETS) and tf.inside_function():
        with tf.control_dependencies([out[i] for i in indices]):
            now = tf.timestamp()
        with tf.control_dependencies([STAMPS[int(name[len(BUCKETS):])].assign(now)]):
            for i in indices:
                out[i] = tf.identity(out[i])
    return handed_over(out, indices, options, name)


allreduce_module.allreduce_group = stamped_group

hvd.init()
rank = hvd.rank()
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
rng = np.random.default_rng(rank)
x = rng.normal(size=(args.batch * 8, args.image_size, args.image_size, 3)).astype("float32")
y = rng.integers(0, CLASSES, size=args.batch * 8).astype("int64")
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch, drop_remainder=True).prefetch(4)


def build():
    """The network benchmark's conv model (shape-agnostic after its first layer) on --image-size inputs."""
    model = conv_model(keras)
    if args.image_size != 16:
        model = keras.Sequential([keras.Input((args.image_size, args.image_size, 3)), *model.layers])
    return model

one = tf.constant(1.0)


def barrier():
    C.allreduce(one, name="stall.barrier", op=C.Sum)


class Ends(keras.callbacks.Callback):
    def __init__(self, buckets: int = 0):
        super().__init__()
        self.ends, self.begins, self.orders, self.stamps, self.buckets = [], [], [], [], buckets

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(time.time())

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())
        if self.buckets:
            stamps = np.array([v.numpy() for v in STAMPS[:self.buckets]])
            order = np.argsort(stamps, kind="stable")
            self.orders.append("".join(f"{k:x}" if k < 16 else f"({k})" for k in order))
            self.stamps.append([float(t) for t in stamps])


def fit_steps(model, steps: int, buckets: int = 0) -> tuple[list[float], list[str], list[list[float]]]:
    """The intervals (s) of `steps` fit steps, after one untimed step, and with `buckets`, each timed step's
    order of handing the buckets over, when (wall-clock seconds, one clock for both test hosts), and when each
    step began (Keras's batch-begin callback)."""
    barrier()
    ends = Ends(buckets)
    model.fit(data, steps_per_epoch=steps + 1, epochs=1, verbose=0, callbacks=[ends])
    return np.diff(ends.ends).tolist(), ends.orders[1:], ends.stamps[1:], ends.begins[1:]


local = build()
local.compile(optimizer=keras.optimizers.SGD(0.001), loss=loss, jit_compile=False)
fit_steps(local, args.warmup)
t_local = statistics.median(fit_steps(local, 2 * args.steps)[0])

grads = [tf.random.normal(v.shape) for v in local.trainable_variables]
comm = tf.function(lambda: C.grouped_allreduce(grads, op=C.Average, name="stall.comm"))
for _ in range(args.warmup):
    comm()[0].numpy()
barrier()
comm_times = []
for _ in range(2 * args.steps):
    begin = time.perf_counter()
    comm()[0].numpy()
    comm_times.append(time.perf_counter() - begin)
t_comm = statistics.median(comm_times)

model = build()
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.001)), loss=loss, jit_compile=False)
fit_steps(model, args.warmup)
buckets = sum(1 for v in STAMPS if v.numpy() != 0.0)  # stamped in the warm-up: the number of buckets
runs, orders, stamps, begins = [], [], [], []
for _ in range(args.runs):
    steps, order, stamp, begin = fit_steps(model, args.steps, buckets)
    runs.append(steps)
    orders.append(order)
    stamps.append(stamp)
    begins.append(begin)

with open(f"{args.out}.rank{rank}", "w") as f:
    json.dump({"rank": rank, "pid": os.getpid(), "grad_bytes": grad_bytes(model), "t_local": t_local,
               "t_comm": t_comm, "runs": runs, "buckets": buckets, "orders": orders,
               "stamps": stamps,
               "begins": begins}, f)
