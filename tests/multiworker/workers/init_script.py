"""A training script that calls hvdkeras.init() itself (the explicit API), for the launcher tests.

    <launcher> python init_script.py --report-dir DIR --out-dir DIR [--epochs 1]

Each worker starts from a different seed (the broadcast makes them equal), trains on its shard of the
bundled digits, prints progress on rank 0 only, checkpoints through hvd.callbacks.ModelCheckpoint and
writes DIR/rank<r>.json with its steps, the job's size and a digest of its final weights.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples"))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from _digits import cnn, load  # noqa: E402
from common import weights_digest  # noqa: E402

import hvdkeras as hvd  # noqa: E402
from hvdkeras.job import threads as _threads  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--report-dir", required=True)
parser.add_argument("--out-dir", required=True)
args = parser.parse_args()

hvd.init()
(x, y), _ = load()
train = hvd.data.shard(tf.data.Dataset.from_tensor_slices((x, y))).batch(args.batch_size)
model = cnn(seed=1 + hvd.rank())
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_learning_rate(1e-3))),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])


class CountSteps(keras.callbacks.Callback):
    steps = 0

    def on_train_batch_end(self, batch, logs=None):
        CountSteps.steps += 1


def reniced_threads():
    """The nice values of this process's threads that run at another priority than the main thread: the threads
    Horovod started, where hvdkeras gave them one (`hvdkeras run` calls init before the script runs, so the
    script sees the result, not the call)."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    found = []
    for tid in _threads.thread_ids():
        try:
            nice = os.getpriority(os.PRIO_PROCESS, tid)
        except ProcessLookupError:
            continue
        if nice != mine:
            found.append(nice)
    return found


os.makedirs(args.out_dir, exist_ok=True)
model.fit(train, epochs=args.epochs, verbose=2 if hvd.rank() == 0 else 0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                     hvd.callbacks.ModelCheckpoint(os.path.join(args.out_dir, "ckpt-{epoch:02d}.keras")),
                     CountSteps()])
os.makedirs(args.report_dir, exist_ok=True)
with open(os.path.join(args.report_dir, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump({"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "cross_size": hvd.cross_size(),
               "horovod_cycle_time": os.environ.get("HOROVOD_CYCLE_TIME"),
               # The priority of the threads Horovod started that still run, and of this (the training) thread.
               "horovod_threads_nice": reniced_threads(),
               "main_thread_nice": os.getpriority(os.PRIO_PROCESS, 0),
               "fit_steps": [CountSteps.steps], "weights_sha256": weights_digest(model.get_weights())}, f)
