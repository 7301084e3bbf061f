"""One worker of benchmarks/xla_benchmark.py: times a model's fit step with XLA kept for the forward and backward
pass (hvdkeras.training.xla) and with XLA off, interleaved in one process; writes OUT_JSON.rank<r>.

    xla_worker.py OUT_JSON --models mlp,conv,transformer [--steps 8] [--rounds 3] [--warmup 2] [--plain]

Every variant of every model is built once and warmed up, then timed in R interleaved rounds of S steps; a
round's figure is the median of its step intervals. Variants: `kept` (jit_compile=True, a DistributedOptimizer:
the forward and backward pass compiled, the gradients reduced outside) and `off` (jit_compile=False, the
gradients' buckets start during the backward pass); with --plain also Keras alone, `keras` (no XLA) and
`keras_xla` (its whole step compiled), for what XLA gives the model without hvdkeras. One compute thread per
worker (each has one core's share). The job forms from horovodrun's or torchrun-style variables.
"""

import argparse
import json
import statistics
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402
from net_worker import conv_model  # noqa: E402

import hvdkeras as hvd  # noqa: E402
from hvdkeras.training import xla  # noqa: E402

CLASSES = 10


def mlp():
    """784 -> 4 x Dense(1024, gelu) -> 10 (3.96M parameters): elementwise work XLA fuses."""
    return keras.Sequential([keras.Input((784,))] + [keras.layers.Dense(1024, activation="gelu") for _ in range(4)]
                            + [keras.layers.Dense(CLASSES)]), (784,), "float32", 64


def conv():
    """net_worker.py's convnet: 8 conv layers (3x3, 32 -> 160 channels) and a classifier on 16x16x3 (0.76M
    parameters)."""
    return conv_model(keras), (16, 16, 3), "float32", 32


def transformer():
    """2 encoder blocks (4 heads of 32, feed-forward 256) over 64 tokens of a 2000-word vocabulary (0.52M)."""
    tokens = keras.Input((64,), dtype="int32")
    h = keras.layers.Embedding(2000, 128)(tokens)
    for _ in range(2):
        a = keras.layers.MultiHeadAttention(num_heads=4, key_dim=32)(h, h)
        h = keras.layers.LayerNormalization()(h + a)
        f = keras.layers.Dense(256, activation="gelu")(h)
        h = keras.layers.LayerNormalization()(h + keras.layers.Dense(128)(f))
    out = keras.layers.Dense(CLASSES)(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(tokens, out), (64,), "int32", 32


MODELS = {"mlp": mlp, "conv": conv, "transformer": transformer}


def dataset(shape, dtype, batch, rank):
    rng = np.random.default_rng(rank)
    n = batch * 8
    x = rng.integers(0, 2000, size=(n, *shape)) if dtype == "int32" else rng.normal(size=(n, *shape))
    y = rng.integers(0, CLASSES, size=n)
    return tf.data.Dataset.from_tensor_slices((x.astype(dtype), y.astype("int64"))).repeat().batch(batch).prefetch(4)


class Intervals(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ends = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())


def runner(name, variant, data):
    tf.random.set_seed(0)
    model, *_ = MODELS[name]()
    distributed = variant in ("kept", "off")
    optimizer = keras.optimizers.Adam(1e-4)
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer) if distributed else optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=variant in ("kept", "keras_xla"))
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)] if distributed else []

    def run(steps):
        hvd.allreduce(tf.constant(0.0), name="xla_bench.barrier")
        timer = Intervals()
        model.fit(data, steps_per_epoch=steps + 1, epochs=1, verbose=0, shuffle=False, callbacks=callbacks + [timer])
        return statistics.median(np.diff(timer.ends))

    return model, run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--models", default="mlp,conv,transformer")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--plain", action="store_true")
    args = parser.parse_args()
    hvd.init()
    result = {"rank": hvd.rank(), "size": hvd.size(), "steps": args.steps, "rounds": args.rounds, "models": {}}
    for name in args.models.split(","):
        _, shape, dtype, batch = MODELS[name]()
        data = dataset(shape, dtype, batch, hvd.rank())
        variants = ["kept", "off"] + (["keras", "keras_xla"] if args.plain else [])
        runs, kept = {}, None
        for variant in variants:
            model, runs[variant] = runner(name, variant, data)
            runs[variant](args.warmup)
            if variant == "kept":
                kept = bool(model.jit_compile) and xla.is_split(model)
                params = int(model.count_params())
                grad_bytes = int(sum(np.prod(v.shape) * 4 for v in model.trainable_variables))
        rounds = {variant: [] for variant in variants}
        for _ in range(args.rounds):
            for variant in variants:
                rounds[variant].append(runs[variant](args.steps))
        result["models"][name] = {"batch": batch, "params": params, "grad_bytes": grad_bytes, "kept": kept,
                                  "rounds_s": rounds,
                                  "step_s": {v: statistics.median(r) for v, r in rounds.items()}}
        print(name, {v: round(float(statistics.median(r)), 4) for v, r in rounds.items()}, flush=True)
    with open(f"{args.out}.rank{hvd.rank()}", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
