"""Elastic training across the test hosts, for `hvdkeras run --min-np 1 --max-np 2 --host-discovery-script`.

    hvdkeras run ... elastic_hosts_script.py --log FILE [--epochs 6] [--steps-per-epoch 30]

The digits CNN with Adam, its state committed every batch (hvdkeras.elastic.KerasState). Each worker appends
one JSON line to FILE whenever a fit starts (after every reset, from the committed state) and whenever an
epoch ends: its host, rank, the world's size, the epoch and batch it stands at, and a digest of its weights and
optimizer variables, so that the test can compare the ranks after each resize. Rank 0 prints the final count.
"""

import argparse
import json
import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples"))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from _digits import cnn, load  # noqa: E402
from common import weights_digest  # noqa: E402

import hvdkeras as hvd  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--steps-per-epoch", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--log", required=True)
args = parser.parse_args()

hvd.init()
(x_train, y_train), _ = load()
model = cnn(seed=1 + hvd.rank())
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_learning_rate(1e-3))),
              loss="sparse_categorical_crossentropy")
state = hvd.elastic.KerasState(model, epoch=0, batch=0, steps=0)


def log(event: str, epoch: int, batch: int) -> None:
    line = json.dumps({"event": event, "host": os.environ.get("HOROVOD_HOSTNAME", socket.gethostname()),
                       "pid": os.getpid(), "rank": hvd.rank(), "size": hvd.size(), "epoch": epoch, "batch": batch,
                       "steps": state.steps, "weights": weights_digest(model.weights),
                       "optimizer": weights_digest(model.optimizer.variables)})
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())  # one write of one short line: lines of two workers never mix
    finally:
        os.close(fd)


class Trace(keras.callbacks.Callback):
    """Counts optimizer steps into the state (committed and rolled back with it) and logs the digests."""

    def on_train_begin(self, logs=None):
        log("start", state.epoch, state.batch)

    def on_train_batch_end(self, batch, logs=None):
        state.steps += 1

    def on_epoch_end(self, epoch, logs=None):
        log("epoch_end", epoch, args.steps_per_epoch)


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        if state.batch >= args.steps_per_epoch:
            state.epoch, state.batch = state.epoch + 1, 0
            continue
        epoch = state.epoch
        data = hvd.data.shard(tf.data.Dataset.from_tensor_slices((x_train, y_train)), seed=epoch)
        data = data.batch(args.batch_size).repeat().skip(state.batch)
        model.fit(data, epochs=epoch + 1, initial_epoch=epoch, steps_per_epoch=args.steps_per_epoch - state.batch,
                  verbose=2 if hvd.rank() == 0 else 0, callbacks=[Trace()] + state.callbacks())


train(state)
if hvd.rank() == 0:
    print(f"finished {state.epoch} epochs, {state.steps} steps, on {hvd.size()} workers", flush=True)
