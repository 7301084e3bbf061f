"""One worker of the network benchmark, one per test host; started by network_benchmark.py.

    net_worker.py keras3|keras2 OUT_JSON --models conv,mlp --steps S --rounds R [--warmup W] [--sweep N,..]
                  [--inter-op 1|0] [--compute cpu|device]

The job forms from the torchrun-style variables the driver sets (RANK, WORLD_SIZE, MASTER_ADDR, ...), through
hvdkeras's rendezvous, for both kinds. Every variant of every model is built once, warmed up, then timed
in R interleaved rounds of S steps (each round starting one variant further on, so that no variant
always follows the same one); a round's figures are the median of its step intervals, and the process's
CPU seconds and seconds waiting for a core per step (all threads). Each rank writes OUT_JSON.rankN.

keras3: local (plain optimizer, no communication), forward (the forward pass and loss alone), first_bucket (the
        forward pass, loss and the gradients of hvdkeras's first bucket: when its first allreduce can start),
        comm / comm_fp16 (the gradients' grouped allreduce alone), link (one allreduce of the same bytes in one
        tensor), hvdkeras default / single / fp16 (and hvdkeras_bN: bucket_bytes=N for each N of --sweep),
        horovod_tape (Horovod's DistributedGradientTape loop on Keras 3), and hvdkeras_loop (hvdkeras's
        DistributedOptimizer in that same loop instead of `fit`).
keras2: local and horovod_keras2 (Horovod's DistributedOptimizer on tf-keras, TF_USE_LEGACY_KERAS=1).

--compute device (keras3 only): each model is first timed layer by layer here (both ranks, averaged), then
replaced by its device-like stand-in (device_compute.py): timed waits that take no core, with the model's own
weight shapes. The calibration is written with the figures, and kept in --calibration's file for the next
launches.
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
import tensorflow as tf
from peer_loops import horovod_tape_step, optimizer_step


def set_threads(inter_op: int) -> None:
    """One compute thread per worker (each test host has one core's share), and `inter_op` inter-op threads:
    1 is the published configuration, 0 TensorFlow's default (what a user gets who sets nothing). Call
    before any op runs."""
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)


BATCH = 32
CLASSES = 10


def conv_model(keras):
    """8 conv layers (3x3, 32 -> 128 channels, ~2.3 MB of float32 gradients) and a linear classifier."""
    tf.random.set_seed(0)
    layers = [keras.Input((16, 16, 3))]
    for i, channels in enumerate((32, 64, 64, 128, 128, 128, 128, 160)):
        layers.append(keras.layers.Conv2D(channels, 3, padding="same", activation="relu"))
        if i in (1, 3, 5):
            layers.append(keras.layers.MaxPooling2D())
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(CLASSES)]
    return keras.Sequential(layers)


def mlp_model(keras):
    """784-640-640-10 (~3.3 MB of gradients): little compute per byte."""
    tf.random.set_seed(0)
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(640, activation="relu"),
                             keras.layers.Dense(640, activation="relu"), keras.layers.Dense(CLASSES)])


MODELS = {"conv": (conv_model, (16, 16, 3)), "mlp": (mlp_model, (784,))}


def dataset(shape, rank):
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(BATCH * 8, *shape)).astype("float32")
    y = rng.integers(0, CLASSES, size=BATCH * 8).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True).prefetch(4)


def grad_bytes(model) -> int:
    return int(sum(np.prod(v.shape) * 4 for v in model.trainable_variables))


def usage() -> tuple[float, float]:
    """The process's CPU seconds (all threads), and the seconds its threads spent runnable but waiting for a
    core (the sum of every thread's run delay, /proc/self/task/*/schedstat; 0 where the kernel has none)."""
    waited = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                waited += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile, or no schedstat
            pass
    return time.process_time(), waited / 1e9


def per_step(marks: list, steps: int) -> tuple[float, float]:
    """CPU and core-waiting seconds per step between the first and the last mark."""
    return (marks[-1][0] - marks[0][0]) / steps, (marks[-1][1] - marks[0][1]) / steps


def step_timer(keras):
    class Intervals(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends, self.usage = [], []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())
            self.usage.append(usage())

    return Intervals()


def fit_runner(keras, model, data, barrier):
    """A function that runs `steps` fit steps; returns the median step interval, and the process's CPU seconds
    and core-waiting seconds per step (all its threads: TensorFlow's and Horovod's), all after the first step."""
    def run(steps):
        barrier()
        timer = step_timer(keras)
        model.fit(data, steps_per_epoch=steps + 1, epochs=1, verbose=0, callbacks=[timer])
        return (statistics.median(np.diff(timer.ends)), *per_step(timer.usage, steps))

    return run


def loop_runner(step_fn, barrier):
    def run(steps):
        barrier()
        ends, marks = [], []
        for _ in range(steps + 1):
            step_fn()
            ends.append(time.perf_counter())
            marks.append(usage())
        return (statistics.median(np.diff(ends)), *per_step(marks, steps))

    return run


def horovod_tape_runner(keras, make, data, loss, barrier):
    """Horovod's own DistributedGradientTape loop on a fresh Keras 3 model `make(keras)`, with plain SGD."""
    model = make(keras)
    opt = keras.optimizers.SGD(0.001)
    opt.build(model.trainable_variables)
    it = iter(data)
    step = horovod_tape_step(model, opt, loss)
    return loop_runner(lambda: float(step(next(it))), barrier)


def measure(runners: dict, steps: int, rounds: int, warmup: int) -> tuple[dict, dict, dict]:
    for run in runners.values():
        run(warmup)
    wall = {name: [] for name in runners}
    cpu = {name: [] for name in runners}
    wait = {name: [] for name in runners}
    names = list(runners)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            w, c, q = runners[name](steps)
            wall[name].append(w)
            cpu[name].append(c)
            wait[name].append(q)
    return wall, cpu, wait


def device_stand_in(keras, model_name, rank, saved=None):
    """(make, shape, calibration): the model's device-like stand-in, timed here and averaged over the ranks, or
    with the times of `saved` (a JSON file of {model: calibration}) where it holds this model's; rank 0 adds
    new ones to it, so that every launch of one benchmark run waits the same times."""
    import device_compute

    from hvdkeras import _collectives as C

    make, shape = MODELS[model_name]
    known = {}
    if saved and os.path.exists(saved):
        with open(saved) as f:
            known = json.load(f)
    times = known.get(model_name)
    if times is None:
        x = np.random.default_rng(rank).normal(size=(BATCH, *shape)).astype("float32")
        times = device_compute.calibrate(make(keras), x)
        pairs = tf.constant([[t["forward_s"], t["backward_s"]] for t in times], tf.float64)
        pairs = C.allreduce(pairs, name=f"bench.calibration.{model_name}", op=C.Average).numpy()
        for t, (forward, backward) in zip(times, pairs):
            t["forward_s"], t["backward_s"] = float(forward), float(backward)
        if saved and rank == 0:
            with open(saved + ".tmp", "w") as f:
                json.dump(dict(known, **{model_name: times}), f, indent=1)
            os.replace(saved + ".tmp", saved)
    return (lambda keras: device_compute.device_model(keras, times, CLASSES)), (CLASSES,), times


def first_bucket(variables) -> list[int]:
    """The indices of the variables in the first bucket hvdkeras's DistributedOptimizer reduces by default."""
    from hvdkeras.reduce.groups import gradient_buckets
    from hvdkeras.reduce.options import default_bucket_bytes

    return gradient_buckets(range(len(variables)), variables, default_bucket_bytes())[0]


def keras3_runners(model_name, rank, sweep, compute="cpu", calibration_file=None):
    import horovod.tensorflow as htf
    import keras

    import hvdkeras as hvd
    from hvdkeras import _collectives as C

    if compute == "device":
        make, shape, calibration = device_stand_in(keras, model_name, rank, calibration_file)
    else:
        (make, shape), calibration = MODELS[model_name], None
    data = dataset(shape, rank)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    one = tf.constant(1.0)

    def barrier():
        C.allreduce(one, name="bench.barrier", op=C.Sum)

    runners = {}
    model = make(keras)
    model.compile(optimizer=keras.optimizers.SGD(0.001), loss=loss, jit_compile=False)
    runners["local"] = fit_runner(keras, model, data, barrier)

    shapes = [v.shape for v in model.trainable_variables]
    nbytes = grad_bytes(model)
    grads = [tf.random.normal(s) for s in shapes]
    grads16 = [tf.cast(g, tf.float16) for g in grads]
    flat = tf.random.normal((nbytes // 4,))

    def comm_fn(tensors, name):
        fn = tf.function(lambda: C.grouped_allreduce(tensors, op=C.Average, name=name))
        return lambda: [t.numpy() for t in fn()[:1]]

    runners["comm"] = loop_runner(comm_fn(grads, f"bench.comm.{model_name}"), barrier)
    runners["comm_fp16"] = loop_runner(comm_fn(grads16, f"bench.comm16.{model_name}"), barrier)
    link = tf.function(lambda: htf.allreduce(flat, op=htf.Sum, name=f"bench.link.{model_name}"))
    runners["link"] = loop_runner(lambda: link().numpy()[:1], barrier)

    xb, yb = next(iter(data))
    # The batch is passed in, as in training: captured as constants, grappler could run stateless ops (the
    # device-like waits) once while optimizing the graph.
    forward = tf.function(lambda x, y: loss(y, model(x, training=True)))
    runners["forward"] = loop_runner(lambda: float(forward(xb, yb)), barrier)
    # The same, with the gradients of the first bucket hvdkeras reduces (the model's last layers): no allreduce
    # can start before they exist.
    first = [model.trainable_variables[i] for i in first_bucket(model.trainable_variables)]

    @tf.function
    def first_gradients(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        return value, tape.gradient(value, first)

    runners["first_bucket"] = loop_runner(lambda: float(first_gradients(xb, yb)[0]), barrier)

    variants = {"hvdkeras": {}, "hvdkeras_single": {"bucket_bytes": 0},
                "hvdkeras_fp16": {"compression": hvd.Compression.fp16}}
    variants.update({f"hvdkeras_b{n}": {"bucket_bytes": n} for n in sweep})
    for variant, kwargs in variants.items():
        m = make(keras)
        m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.001), **kwargs), loss=loss,
                  jit_compile=False)
        runners[variant] = fit_runner(keras, m, data, barrier)

    runners["horovod_tape"] = horovod_tape_runner(keras, make, data, loss, barrier)
    m = make(keras)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.001))
    opt.build(m.trainable_variables)
    loop_it = iter(data)
    loop_step = optimizer_step(m, opt, loss)
    runners["hvdkeras_loop"] = loop_runner(lambda: float(loop_step(next(loop_it))), barrier)
    return runners, nbytes, calibration


def keras2_runners(model_name, rank, sweep, compute="cpu", calibration_file=None):
    import horovod.tensorflow as htf
    import horovod.tensorflow.keras as hvdk

    keras = tf.keras  # tf-keras 2.x: TF_USE_LEGACY_KERAS=1
    make, shape = MODELS[model_name]
    data = dataset(shape, rank)
    one = tf.constant(1.0)

    def barrier():
        htf.allreduce(one, name="bench.barrier", op=htf.Sum)

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    runners = {}
    model = make(keras)
    model.compile(optimizer=keras.optimizers.SGD(0.001), loss=loss)
    runners["local"] = fit_runner(keras, model, data, barrier)
    m = make(keras)
    m.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.001)), loss=loss)
    runners["horovod_keras2"] = fit_runner(keras, m, data, barrier)
    return runners, grad_bytes(model), None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["keras3", "keras2"])
    parser.add_argument("out")
    parser.add_argument("--models", default="conv,mlp")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--sweep", default="", help="more bucket sizes to time (keras3), comma-separated bytes")
    parser.add_argument("--inter-op", type=int, default=1, help="inter-op threads; 0: TensorFlow's default")
    parser.add_argument("--compute", choices=["cpu", "device"], default="cpu",
                        help="the models' compute: real, on the CPU, or device-like timed waits (keras3 only)")
    parser.add_argument("--calibration", default=None, metavar="JSON",
                        help="--compute device: the per-layer times to use, or where rank 0 saves them")
    args = parser.parse_args()
    if args.compute == "device" and args.kind != "keras3":
        parser.error("--compute device is for keras3 only")
    set_threads(args.inter_op)

    # Both kinds form the job through hvdkeras's rendezvous from the launcher's variables: hvdkeras.init()
    # does it itself; for Horovod's tf-keras integration it is done here, and Horovod then starts with its
    # own defaults (HOROVOD_CYCLE_TIME 1 ms).
    from hvdkeras.job import launchers as launching
    from hvdkeras.job import rendezvous

    launch = launching.detect(os.environ)
    if args.kind == "keras2":
        import horovod.tensorflow.keras as hvdk

        with rendezvous.init_watchdog(rendezvous.form(launch)):
            hvdk.init()
        rank, size = hvdk.rank(), hvdk.size()
        import tf_keras

        framework = f"tf-keras {tf_keras.__version__}"
    else:
        import hvdkeras as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        import keras

        framework = f"keras {keras.__version__}"
    if size != launch.size:
        raise SystemExit(f"formed a job of {size}, expected {launch.size}")
    build = keras2_runners if args.kind == "keras2" else keras3_runners
    result = {"rank": rank, "size": size, "framework": framework, "threads": 1, "inter_op": args.inter_op,
              "batch_per_worker": BATCH, "compute": args.compute,
              "models": {}}
    for name in args.models.split(","):
        runners, nbytes, calibration = build(name, rank, [int(b) for b in args.sweep.split(",") if b], args.compute,
                                             args.calibration)
        wall, cpu, wait = measure(runners, args.steps, args.rounds, args.warmup)
        result["models"][name] = {"grad_bytes": nbytes, "rounds_s": wall, "cpu_rounds_s": cpu,
                                  "wait_rounds_s": wait, "calibration": calibration}
    path = f"{args.out}.rank{rank}"
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
