"""One worker of the one-step timeline (benchmarks/step_timeline.py), one per test host.

    timeline_worker.py OUT_PREFIX [--steps 12] [--inter-op 1|0]

Trains the network benchmark's conv model with hvdkeras's DistributedOptimizer (buckets, the defaults) and
records, for every step and every bucket, on one clock (wall time, seconds):
- grad_ready: when the bucket's last gradient exists (a timestamp op that waits for the bucket's gradients);
- reduced: when its reduced gradients exist (one that waits for the allreduce's outputs);
- the step's start and end (Keras's batch callbacks) and the end of its forward pass (the loss).
Horovod's own timeline (HOROVOD_TIMELINE, started after warm-up with cycle marks) gives, per tensor, when
it was enqueued, when negotiation ended and when the Gloo transfer ran. An allreduce named
`timeline.align`, issued right after the timeline starts, ties Horovod's clock to the wall clock.
Writes OUT_PREFIX.rankN.json (the timestamps) and OUT_PREFIX.rankN.horovod.json (Horovod's timeline).
"""

import argparse
import json
import os
import time

import tensorflow as tf
from net_worker import conv_model, dataset  # sets one thread of each kind; --inter-op below may change it

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--warmup", type=int, default=4)
parser.add_argument("--inter-op", type=int, default=1, help="inter-op threads; 0: TensorFlow's default")
args = parser.parse_args()
tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)  # 0: TensorFlow's default

import horovod.tensorflow as htf  # noqa: E402
import keras  # noqa: E402

import hvdkeras as hvd  # noqa: E402
from hvdkeras import _collectives as C  # noqa: E402
from hvdkeras.optimizer import DistributedOptimizer  # noqa: E402

hvd.init()
rank = hvd.rank()
MARKS = f"{args.out}.rank{rank}.marks"


def mark(what: str, name: str, after: list) -> None:
    """Prints the wall time once every tensor in `after` exists. Print and timestamp ops touch no resource,
    so TensorFlow's automatic control dependencies do not order them against the allreduces."""
    with tf.control_dependencies(after):
        stamp = tf.timestamp()
    tf.print(what, name, tf.strings.as_string(stamp, precision=6), output_stream=f"file://{MARKS}")


reduce_dense = DistributedOptimizer._reduce_dense


def traced_reduce_dense(self, out, indices, name):
    mark("grad_ready", name, [out[i] for i in indices])
    reduce_dense(self, out, indices, name)
    mark("reduced", name, [out[i] for i in indices])


DistributedOptimizer._reduce_dense = traced_reduce_dense

model = conv_model(keras)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def loss(y, logits):
    value = loss_fn(y, logits)
    mark("forward_end", "loss", [value])
    return value


model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.001)), loss=loss, jit_compile=False)
buckets = None


class Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.begin, self.end = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.begin.append(time.time())

    def on_train_batch_end(self, batch, logs=None):
        self.end.append(time.time())


data = dataset((16, 16, 3), rank)
model.fit(data, steps_per_epoch=args.warmup, epochs=1, verbose=0)
horovod_file = f"{args.out}.rank{rank}.horovod.json"
htf.start_timeline(horovod_file, mark_cycles=True)
time.sleep(0.5)
before = time.time()
C.allreduce(tf.constant(1.0), name="timeline.align", op=C.Sum).numpy()
after = time.time()
steps = Steps()
model.fit(data, steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=[steps])
htf.stop_timeline()
with open(f"{args.out}.rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "inter_op": args.inter_op, "align": [before, after], "step_begin": steps.begin,
               "step_end": steps.end, "marks": [m for m in open(MARKS).read().split("\n") if m],
               "horovod_cycle_time": os.environ.get("HOROVOD_CYCLE_TIME")}, f)
