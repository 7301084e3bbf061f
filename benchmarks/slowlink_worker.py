"""One worker of the slow-link benchmark, one per test host; started by slowlink_benchmark.py.

    slowlink_worker.py OUT_JSON --variants exact,fp16,... --steps S --eval-every E [--iface hklab0]

The job forms from the torchrun-style variables the driver sets. The task: a teacher network labels points of
a 64-dimensional Gaussian with 10 classes; the student, an MLP 64-1024-1024-10 (1.1 M parameters, 4.5 MB of
float32 gradients, almost all in two matrices), learns it with SGD with momentum 0.9 and a cosine decay of the
rate from 0.05 to 0 over the S steps, 64 rows per worker and step, each worker on its own rows. Every variant
trains a fresh student from the same initial weights for S steps; every E steps and after the last, rank 0's
student is evaluated on 20,000 held-out points (the clock stopped: the evaluation is not training time). Bytes
on the link are the test hosts' interface counters (/proc/net/dev in each host's namespace) around the
training steps. Each rank writes OUT_JSON.rankN.
"""

import argparse
import json
import time

import numpy as np
import tensorflow as tf

DIM, CLASSES, HIDDEN, BATCH = 64, 10, 1024, 64
LR, MOMENTUM = 0.05, 0.9


def variants() -> dict:
    """Each variant's DistributedOptimizer arguments (made fresh per run: reducers hold state)."""
    import hvdkeras as hvd
    from hvdkeras.reduce import DiLoCoReducer, LocalSGDReducer, PowerSGDReducer

    return {
        "exact": lambda: {},
        "fp16": lambda: {"compression": hvd.Compression.fp16},
        "powersgd_r1": lambda: {"reducer": PowerSGDReducer(rank=1, start_step=20)},
        "powersgd_r4": lambda: {"reducer": PowerSGDReducer(rank=4, start_step=20)},
        "local_sgd_h4": lambda: {"reducer": LocalSGDReducer(period=4, warmup_steps=20)},
        "local_sgd_h16": lambda: {"reducer": LocalSGDReducer(period=16, warmup_steps=20)},
        "diloco_h8": lambda: {"reducer": DiLoCoReducer(period=8)},
        "diloco_h32": lambda: {"reducer": DiLoCoReducer(period=32)},
    }


def data(rank: int, size: int, steps: int):
    """The teacher's labels for this worker's training rows (its own: rows rank::size) and the held-out set."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(size=(DIM, 32)) / np.sqrt(DIM)
    w2 = rng.normal(size=(32, CLASSES)) / np.sqrt(32)

    def label(x):
        return np.argmax(np.maximum(x @ w1, 0) @ w2 + 0.5 * x[:, :CLASSES], axis=1).astype("int32")

    x = rng.normal(size=(steps * BATCH * size, DIM)).astype("float32")
    xv = rng.normal(size=(20_000, DIM)).astype("float32")
    return x[rank::size], label(x)[rank::size], xv, label(xv)


def tx_bytes(iface: str) -> int:
    """Bytes this network namespace's `iface` has sent."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == iface:
                return int(rest.split()[8])
    raise RuntimeError(f"no interface {iface!r} in /proc/net/dev")


def student():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(CLASSES)])


def run(name: str, make: callable, x, y, xv, yv, args) -> dict:
    import keras

    import hvdkeras as hvd

    model = student()
    schedule = keras.optimizers.schedules.CosineDecay(LR, args.steps)  # to 0 at the last step: a settled end
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(schedule, momentum=MOMENTUM), **make())
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    def barrier(tag):
        hvd.allreduce(tf.constant(0.0), name=f"slowlink.{name}.{tag}")

    def accuracy():
        logits = model.predict(xv, batch_size=2000, verbose=0)
        return float(np.mean(np.argmax(logits, axis=1) == yv))

    # Traced (and the optimizer built) before the clock starts; nothing runs.
    step.get_concrete_function(tf.TensorSpec((BATCH, DIM), tf.float32), tf.TensorSpec((BATCH,), tf.int32))
    barrier("start")
    curve, train_s, step_s = [], 0.0, []
    sent = tx_bytes(args.iface)
    for k in range(args.steps):
        t = time.perf_counter()
        step(x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]).numpy()
        dt = time.perf_counter() - t
        train_s += dt
        step_s.append(dt)
        if (k + 1) % args.eval_every == 0 or k + 1 == args.steps:
            sent_now = tx_bytes(args.iface)
            if hvd.rank() == 0:
                curve.append({"step": k + 1, "train_s": train_s, "accuracy": accuracy()})
            barrier(f"eval{k}")
            sent += tx_bytes(args.iface) - sent_now  # the barrier's bytes are not the training's
    total = tx_bytes(args.iface) - sent
    return {"curve": curve, "train_s": train_s, "step_ms": float(np.median(step_s) * 1e3),
            "mean_step_ms": float(np.mean(step_s) * 1e3), "tx_bytes": total, "steps": args.steps}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--variants", default=",".join(variants()))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--iface", default="hklab0")
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import hvdkeras as hvd

    hvd.init()
    x, y, xv, yv = data(hvd.rank(), hvd.size(), args.steps)
    table = variants()
    out = {"rank": hvd.rank(), "grad_bytes": int(sum(np.prod(v.shape) * 4 for v in student().trainable_variables)),
           "variants": {}}
    for name in args.variants.split(","):
        out["variants"][name] = run(name, table[name], x, y, xv, yv, args)
        print(f"rank {hvd.rank()} {name}: {out['variants'][name]['train_s']:.1f} s, "
              f"{out['variants'][name]['tx_bytes'] / args.steps / 1e3:.0f} kB sent per step", flush=True)
    with open(f"{args.out}.rank{hvd.rank()}", "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
