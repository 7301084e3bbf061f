"""One worker of the one-step timeline (benchmarks/step_timeline.py), one per test host.

    timeline_worker.py OUT_PREFIX [--steps 12] [--inter-op 1|0]

Trains the network benchmark's conv model with hvdkeras's DistributedOptimizer (buckets, the defaults) and
records its timed steps twice over, on one clock (wall time, seconds):
- TensorFlow's profiler: every op's start and end, among them the ops that produce each bucket's gradients
  (their graph names are recorded when the step is traced) and each bucket's allreduce kernel, whose start is
  when it hands the bucket to Horovod;
- Horovod's own timeline (HOROVOD_TIMELINE, started after warm-up with cycle marks): per tensor, when its
  negotiation began and ended and when the Gloo transfer ran. An allreduce named `timeline.align`, issued
  right after the timeline starts, ties Horovod's clock to the wall clock;
- the step's start and end (Keras's batch callbacks).
Writes OUT_PREFIX.rankN.json (the steps and the profiled ops) and OUT_PREFIX.rankN.horovod.json (Horovod's
timeline).
"""

import argparse
import glob
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import tensorflow as tf
from net_worker import conv_model, dataset, set_threads

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--warmup", type=int, default=4)
parser.add_argument("--inter-op", type=int, default=1, help="inter-op threads; 0: TensorFlow's default")
args = parser.parse_args()
set_threads(args.inter_op)

import horovod.tensorflow as htf  # noqa: E402
import keras  # noqa: E402

import hvdkeras as hvd  # noqa: E402
from hvdkeras import _collectives as C  # noqa: E402
from hvdkeras.reduce import AllreduceReducer  # noqa: E402
from hvdkeras.reduce.groups import dense_groups  # noqa: E402

hvd.init()
rank = hvd.rank()
# The graph names of the ops that produce each bucket's gradients, recorded when the train step is traced.
BUCKET_OPS: dict[str, list[str]] = {}
reduce = AllreduceReducer.reduce


def traced_reduce(self, grads, variables, name="hvdkeras.gradients"):
    dense = [i for i, g in enumerate(grads) if g is not None]
    for k, group in enumerate(dense_groups(dense, variables, self.options)):
        BUCKET_OPS[f"{name}.{k}"] = [grads[i].op.name for i in group]
    return reduce(self, grads, variables, name=name)


AllreduceReducer.reduce = traced_reduce
model = conv_model(keras)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.001)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)


class Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.begin, self.end = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.begin.append(time.time())

    def on_train_batch_end(self, batch, logs=None):
        self.end.append(time.time())


ASYNC_EVENTS = {"ExecutorState::ProcessAsync::Start": "", "ExecutorState::ProcessAsync::Done": ".done"}


def profiled_ops(logdir: str, align_wall: float) -> list:
    """Every op the TensorFlow profiler recorded on this host, as [graph name, op type, begin, end] in wall-clock
    seconds; an asynchronous kernel's done callback has the type `<op type>.done`. The profiler's clock starts
    at the trace's start; a trace event named `timeline.align`, taken at `align_wall`, ties it to the wall
    clock. Variable reads are left out (hundreds per step, none of interest)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))[-1]).read_bytes())
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    events, align = [], None
    for line in plane.lines:
        for event in line.events:
            name = plane.event_metadata[event.metadata_id].name
            begin = line.timestamp_ns + event.offset_ps // 1000
            if name == "timeline.align":
                align = begin
            elif name in ASYNC_EVENTS:
                # An asynchronous kernel (Horovod's) is two events whose stats name the op: its start, which
                # hands the tensors to Horovod, and its done callback, on Horovod's thread.
                stats = {plane.stat_metadata[st.metadata_id].name:
                         st.str_value or (plane.stat_metadata[st.ref_value].name if st.ref_value else "")
                         for st in event.stats}  # a repeated string is a reference to the stats' names
                events.append([stats.get("name", ""), stats.get("kernel_type", "") + ASYNC_EVENTS[name], begin,
                               begin + event.duration_ps // 1000])
            elif ":" in name and not name.endswith(":ReadVariableOp"):
                events.append([*name.rsplit(":", 1), begin, begin + event.duration_ps // 1000])
    for event in events:
        event[0] = event[0].rsplit("StatefulPartitionedCall/", 1)[-1]  # the names the traced graph gave them
    shift = align_wall - align / 1e9
    return [[op, kind, b / 1e9 + shift, e / 1e9 + shift] for op, kind, b, e in events]


data = dataset((16, 16, 3), rank)
model.fit(data, steps_per_epoch=args.warmup, epochs=1, verbose=0)
horovod_file = f"{args.out}.rank{rank}.horovod.json"
htf.start_timeline(horovod_file, mark_cycles=True)
time.sleep(0.5)
before = time.time()
C.allreduce(tf.constant(1.0), name="timeline.align", op=C.Sum).numpy()
after = time.time()
logdir = tempfile.mkdtemp(prefix=f"hvdk-profile-{rank}-")
tf.profiler.experimental.start(logdir)
with tf.profiler.experimental.Trace("timeline.align"):
    profile_align = time.time()
steps = Steps()
model.fit(data, steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=[steps])
tf.profiler.experimental.stop()
htf.stop_timeline()
ops = profiled_ops(logdir, profile_align)
shutil.rmtree(logdir, ignore_errors=True)
with open(f"{args.out}.rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "inter_op": args.inter_op, "align": [before, after], "step_begin": steps.begin,
               "step_end": steps.end, "bucket_ops": BUCKET_OPS, "ops": ops,
               "horovod_cycle_time": os.environ.get("HOROVOD_CYCLE_TIME")}, f)
