"""One worker of benchmarks/balance_benchmark.py's step times: the same model trained with Adam four ways in this
one process, taking turns, so that every way meets the same state of the machine, and what each step took.

    balance_step_worker.py OUT --model M --batch B --steps S --rounds R

The ways, each its own model and DistributedOptimizer, with the same first weights:
- unsharded: shard_optimizer_state=False;
- whole: sharded, each variable owned whole by one worker (the partition before variables were cut into pieces);
- pieces: sharded, the default partition;
- ungathered: pieces, but the updated pieces are not all-gathered after the update (after_apply does nothing).
  A diagnostic, not a way to train: the workers' weights part after the first step. Its step is the sharded
  step less the weights' allgather, the one collective that ZeRO adds between the update and the next forward
  pass (pieces against ungathered: what that collective costs).

Each round, each way trains S steps (one fit) in turn; the round's figure for a way is the median of its steps
but the first two. Writes OUT/rank<r>.json: {way: [per-round median step seconds]}.
"""

import argparse
import json
import os
import statistics
import time

import keras
import tensorflow as tf
from balance_models import make_batch, make_model

import hvdkeras as hvd

WAYS = ("unsharded", "whole", "pieces", "ungathered")

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--model", choices=("mlp", "embedding"), required=True)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--rounds", type=int, default=8)
args = parser.parse_args()

hvd.init()


def build(way: str) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = make_model(args.model)
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-4), shard_optimizer_state=way != "unsharded")
    if way == "whole":
        opt.reducer.optimizer_state.split_variables = False
    if way == "ungathered":  # this optimizer only: the diagnostic way above
        sink = tf.Variable(0.0, trainable=False)

        def after_apply(reduced):
            # What the allgather would have waited for still runs (a traced step prunes an unused collective, and
            # a worker that skipped its part of one would hold the others): an empty slice of each, into `sink`.
            for t in reduced.pending[1] if reduced.pending is not None else ():
                sink.assign_add(tf.reduce_sum(tf.cast(tf.reshape(t, [-1])[:0], tf.float32)))

        opt.reducer.after_apply = after_apply
    model.compile(optimizer=opt, loss="mse")
    opt.build(model.trainable_variables)
    return model


class Timer(keras.callbacks.Callback):
    """Records each training step's duration, from Keras's batch-begin to its batch-end."""

    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self.start)


x, y = make_batch(args.model, args.batch, hvd.rank())
data = tf.data.Dataset.from_tensors((x, y)).repeat(args.steps)
models = {way: build(way) for way in WAYS}
for way, model in models.items():  # traces each way's step; the diagnostic way's weights part from here on
    model.fit(data.take(3), epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0, check_models=way != "ungathered")])
rounds: dict = {way: [] for way in WAYS}
for _ in range(args.rounds):
    for way, model in models.items():
        timer = Timer()
        model.fit(data, epochs=1, verbose=0, callbacks=[timer])
        rounds[way].append(statistics.median(timer.times[2:]))
with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump({"rank": hvd.rank(), "size": hvd.size(), "model": args.model, "batch": args.batch,
               "steps": args.steps, "rounds": rounds}, f)
