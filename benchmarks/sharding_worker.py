"""One worker of benchmarks/sharding_benchmark.py and balance_benchmark.py: trains a model with Adam for a few
steps, with or without shard_optimizer_state, and writes what it measured to OUT/rank<r>.json.

    sharding_worker.py OUT --width W --layers L --steps S [--shard [--whole]] [--model M] [--cgroup PATH]

--model: "stack" (LAYERS x Dense(WIDTH), the default), "mlp" (Dense(32->256), Dense(256->256), Dense(256->4)) or
"embedding" (an Embedding(2000, 64) of 30% of the parameters, averaged, then Dense(512), Dense(512), Dense(4)).
--whole: each variable owned whole by one worker (the partition before variables were cut into pieces).

With --cgroup, the process first moves itself into that memory cgroup (its limit is this worker's memory), so
the kernel kills it when it needs more.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--width", type=int, required=True)
parser.add_argument("--layers", type=int, required=True)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--shard", action="store_true")
parser.add_argument("--whole", action="store_true")
parser.add_argument("--model", choices=("stack", "mlp", "embedding"), default="stack")
parser.add_argument("--cgroup", default=None)
args = parser.parse_args()

if args.cgroup:
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    with open(os.path.join(f"{args.cgroup}-{rank}", "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from balance_models import make_batch, make_model  # noqa: E402 (TensorFlow after the cgroup move)

import hvdkeras as hvd  # noqa: E402
from hvdkeras.reduce import sharded_state  # noqa: E402

hvd.init()
keras.utils.set_random_seed(0)
model = make_model(args.model, args.width, args.layers)
x, y = make_batch(args.model, args.batch, hvd.rank(), args.width)
opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-4), shard_optimizer_state=args.shard)
if args.whole:
    opt.reducer.optimizer_state.split_variables = False
model.compile(optimizer=opt, loss="mse")
opt.build(model.trainable_variables)
times = []


def hwm_bytes() -> int:
    """The process's peak resident memory since it was last reset (VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


class Timer(keras.callbacks.Callback):
    """Times each step; after the first, resets the peak resident memory, so that what is read at the end is
    the peak of the training steps alone (not of building the model and broadcasting its first state)."""

    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        times.append(time.perf_counter() - self.start)
        if batch == 0:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")


data = tf.data.Dataset.from_tensors((x, y)).repeat(args.steps)
model.fit(data, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Timer()])
steps_peak = hwm_bytes()


def nbytes(variables):
    return int(sum(np.prod(v.shape) * tf.as_dtype(v.dtype).size for v in variables))


slots = sharded_state.slots(opt.inner_optimizer)
shard = opt.reducer.shard
model_ids = {id(v) for v in model.trainable_variables}
result = {
    "rank": hvd.rank(), "size": hvd.size(), "shard": args.shard, "whole": args.whole, "model": args.model,
    "width": args.width, "layers": args.layers,
    "params": int(model.count_params()), "optimizer_state_bytes": nbytes(slots),
    "optimizer_state_elements": int(sum(np.prod(v.shape) for v in slots)),
    # The variables this worker updates in place of pieces of the model's (1/N of the cut ones: extra memory).
    "slice_bytes": nbytes([s for s in shard.owned() if id(s) not in model_ids]) if shard else 0,
    "weights_bytes": nbytes(model.trainable_variables),
    # The process's peak resident memory (building and broadcasting included), and the peak of the steps after
    # the first one.
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "steps_peak_rss_bytes": steps_peak,
    "step_seconds": statistics.median(times[2:]) if len(times) > 2 else None,
    "loss_finite": bool(np.isfinite(model.evaluate(x, y, verbose=0))),
}
with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(result, f)
print(json.dumps(result), file=sys.stderr)
