"""One benchmark measurement on one worker; started by run_benchmarks.py through horovodrun.

    bench_worker.py MODE OUT_JSON [--quick]

MODE: overhead-hvdkeras | overhead-raw | overhead-keras2 | scaling | gradpath | idle, or several joined by "+"
(one launch; the result is then {mode: result})
Rank 0 writes the result to OUT_JSON. Timings: warm-up first, then repetitions, medians.
"""

import json
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf
from peer_loops import horovod_tape_step

MODE, OUT = sys.argv[1], sys.argv[2]
QUICK = "--quick" in sys.argv

if MODE.startswith("scaling"):
    # Each worker owns one core: one intra-op and one inter-op thread (set before any op runs).
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

STEPS = 4 if QUICK else 40  # steps per repetition
REPS = 2 if QUICK else 7
BATCH = 64


def write(result):
    with open(OUT + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(OUT + ".tmp", OUT)


def synthetic(n_features=784, classes=10, n=BATCH * 8):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, n_features)).astype("float32"), rng.integers(0, classes, size=n).astype("int64")


def mlp(keras):
    keras.utils.set_random_seed(0) if hasattr(keras.utils, "set_random_seed") else tf.random.set_seed(0)
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
                             keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])


class EpochTimer:
    """A Keras callback (built for whichever Keras is in use) recording each epoch's duration."""

    @staticmethod
    def make(keras):
        class Timer(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.times = []

            def on_epoch_begin(self, epoch, logs=None):
                self._start = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                self.times.append(time.perf_counter() - self._start)

        return Timer()


def fit_step_time(keras, model, callbacks, rank):
    x, y = synthetic()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH).prefetch(2)
    timer = EpochTimer.make(keras)
    model.fit(ds, steps_per_epoch=STEPS, epochs=REPS + 1, verbose=0, callbacks=callbacks + [timer])
    return statistics.median(timer.times[1:]) / STEPS


def overhead_hvdkeras():
    import keras

    import hvdkeras as hvd

    hvd.init()
    model = mlp(keras)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cbs = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
    return hvd.rank(), {"step_s": fit_step_time(keras, model, cbs, hvd.rank())}


def overhead_raw():
    import horovod.tensorflow as hvd
    import keras

    hvd.init()
    model = mlp(keras)
    opt = keras.optimizers.SGD(0.01)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    hvd.broadcast_variables([v.value for v in model.variables], root_rank=0)
    x, y = synthetic()
    it = iter(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH).prefetch(2))
    step = horovod_tape_step(model, opt, loss_fn)

    times = []
    for _ in range(REPS + 1):
        start = time.perf_counter()
        for _ in range(STEPS):
            loss = step(next(it))
        float(loss)
        times.append(time.perf_counter() - start)
    return hvd.rank(), {"step_s": statistics.median(times[1:]) / STEPS}


def overhead_keras2():
    # TF_USE_LEGACY_KERAS=1 is set by the launcher: tf.keras is tf-keras 2.x here.
    import horovod.tensorflow.keras as hvdk

    keras = tf.keras
    hvdk.init()
    model = mlp(keras)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cbs = [hvdk.callbacks.BroadcastGlobalVariablesCallback(0)]  # its MetricAverageCallback fails on TF 2.21
    import tf_keras

    step = fit_step_time(keras, model, cbs, hvdk.rank())
    return hvdk.rank(), {"step_s": step, "keras": f"tf-keras {tf_keras.__version__}"}


def scaling(plain=False):
    """Images/s of a compute-bound CNN; `plain`: no Horovod at all (the machine's own ceiling)."""
    import keras

    if plain:
        hvd = None
        rank = 0
    else:
        import hvdkeras as hvd

        hvd.init()
        rank = hvd.rank()
    keras.utils.set_random_seed(0)
    # Compute-bound: many convolution FLOPs per parameter (about 60k parameters, 0.25 MB of gradients).
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    optimizer = keras.optimizers.SGD(0.01)
    model.compile(optimizer=optimizer if plain else hvd.DistributedOptimizer(optimizer),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batch = 64
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 4, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=batch * 4).astype("int64")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch).prefetch(2)
    timer = EpochTimer.make(keras)
    steps = 2 if QUICK else 10
    callbacks = [timer] if plain else [hvd.callbacks.BroadcastGlobalVariablesCallback(0), timer]
    model.fit(ds, steps_per_epoch=steps, epochs=REPS + 1, verbose=0, callbacks=callbacks)
    per_worker = batch * steps / statistics.median(timer.times[1:])
    if plain:
        return rank, {"images_per_s_per_worker": per_worker}
    total = float(hvd.allreduce(per_worker, op=hvd.Sum))
    return rank, {"images_per_s_per_worker": per_worker, "images_per_s_total": total, "size": hvd.size()}


def _reduction_fns(hvd, raw, keras, grads, parts, whole, label, tag):
    """The three ways to reduce the same bytes, as tf.functions: hvdkeras, raw grouped, raw single."""
    compression = hvd.Compression.fp16 if label == "fp16" else hvd.Compression.none
    raw_compression = raw.Compression.fp16 if label == "fp16" else raw.Compression.none
    # All the gradients exist at once here (no backward pass to overlap), so one fused call, like the peers'.
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.0), compression=compression, bucket_bytes=0)

    @tf.function
    def hvdkeras_reduce():
        return opt.reduce_gradients(grads, parts)

    @tf.function
    def horovod_grouped():
        return raw.grouped_allreduce(grads, compression=raw_compression, name=f"grouped.{tag}")

    @tf.function
    def horovod_single():
        return raw.allreduce(whole, compression=raw_compression, name=f"single.{tag}")

    return (("hvdkeras", hvdkeras_reduce), ("horovod_grouped", horovod_grouped), ("horovod", horovod_single))


def gradpath():
    import horovod.tensorflow as raw
    import keras

    import hvdkeras as hvd

    hvd.init()
    sizes_mb = [1, 4] if QUICK else [1, 16, 64]
    reps = 3 if QUICK else 21
    out = {}
    for mb in sizes_mb:
        n = mb * 1024 * 1024 // 4
        # The same bytes as 4 gradient tensors (what a model hands the optimizer) and as one tensor.
        parts = [keras.Variable(np.zeros(n // 4, "float32")) for _ in range(4)]
        grads = [tf.random.normal([n // 4]) for _ in range(4)]
        whole = tf.random.normal([n])
        row = {}
        for label in ("none", "fp16"):
            fns = _reduction_fns(hvd, raw, keras, grads, parts, whole, label, f"{mb}.{label}")
            times = {name: [] for name, _ in fns}
            for rep in range(reps + 2):
                # Alternate them, so drift (frequency, the other worker) hits all alike; 2 warm-up rounds.
                for name, fn in fns:
                    start = time.perf_counter()
                    tf.nest.map_structure(lambda t: t.numpy(), fn())
                    if rep >= 2:
                        times[name].append(time.perf_counter() - start)
            for name, _ in fns:
                row[f"{name}_{label}_s"] = statistics.median(times[name])
        src = np.random.default_rng(0).normal(size=n).astype("float32")
        dst = np.empty_like(src)
        copies = []
        for _ in range(reps):
            start = time.perf_counter()
            np.copyto(dst, src)
            copies.append(time.perf_counter() - start)
        row["memcpy_s"] = statistics.median(copies)
        out[str(mb)] = row
    return hvd.rank(), out


def idle():
    """CPU time Horovod's background thread uses while nothing is communicated (a share of one core)."""
    import horovod.tensorflow as raw

    raw.init()
    seconds = 1.0 if QUICK else 5.0
    start = time.process_time()
    time.sleep(seconds)
    return raw.rank(), {"idle_cpu_fraction": (time.process_time() - start) / seconds}


MODES = {
    "idle": idle,
    "overhead-hvdkeras": overhead_hvdkeras,
    "overhead-raw": overhead_raw,
    "overhead-keras2": overhead_keras2,
    "scaling": scaling,
    "scaling-plain": lambda: scaling(plain=True),
    "gradpath": gradpath,
}
if "+" in MODE:
    # Several modes in one launch (run_benchmarks.py --quick): {mode: result}.
    result = {}
    for mode in MODE.split("+"):
        rank, result[mode] = MODES[mode]()
else:
    rank, result = MODES[MODE]()
if rank == 0:
    write(result)
