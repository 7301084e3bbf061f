"""Elastic training of the digits CNN: keeps going when workers leave or join.

    cat > discover.sh <<'SH'
    #!/bin/sh
    echo localhost:2
    SH
    chmod +x discover.sh
    .venv/bin/hvdkeras run -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover.sh --no-shard \\
        examples/elastic_digits.py

Each epoch has a fixed number of steps; every worker trains on its shard of the data, re-split whenever the
set of workers changes. The state (weights, optimizer slots, epoch, batch, steps) is committed every batch;
after a worker is lost the others continue from the last commit, and a worker that joins receives it.
"""

import argparse
import os

import keras
import tensorflow as tf
from _digits import cnn, load

import hvdkeras as hvd

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--steps-per-epoch", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--shard-optimizer-state", action="store_true",
                    help="shard Adam's state across the workers (re-sharded whenever workers leave or join)")
args = parser.parse_args()

hvd.init()
(x_train, y_train), _ = load()
model = cnn()
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_learning_rate(1e-3)),
                                                 shard_optimizer_state=args.shard_optimizer_state),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
state = hvd.elastic.KerasState(model, epoch=0, batch=0, steps=0)


class CountSteps(keras.callbacks.Callback):
    """Counts optimizer steps into the state, so they are committed (and rolled back) with it."""

    def on_train_batch_end(self, batch, logs=None):
        state.steps += 1


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        if state.batch >= args.steps_per_epoch:  # lost between the last batch's commit and the epoch's
            state.epoch, state.batch = state.epoch + 1, 0
            continue
        epoch = state.epoch
        # Re-shard for the workers alive now; the same seed per epoch on every worker.
        data = hvd.data.shard(tf.data.Dataset.from_tensor_slices((x_train, y_train)), seed=epoch)
        data = data.batch(args.batch_size).repeat().skip(state.batch)
        model.fit(data, epochs=epoch + 1, initial_epoch=epoch, steps_per_epoch=args.steps_per_epoch - state.batch,
                  verbose=2 if hvd.rank() == 0 else 0, callbacks=[CountSteps()] + state.callbacks())


train(state)
if hvd.rank() == 0:
    print(f"finished {state.epoch} epochs, {state.steps} steps, on {hvd.size()} workers, optimizer state "
          f"{'sharded' if model.optimizer.sharded else 'whole'} (pid {os.getpid()})")
