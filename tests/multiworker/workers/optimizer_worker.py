"""DistributedOptimizer on N workers vs one process on the global batches, in one launch.

Every worker trains on its slice of each global batch of N*B samples; the reference is the plain optimizer
in one process on the whole global batches (computed here too, without collectives).
"""


import numpy as np

from common import count_collectives, max_abs_diff, max_rel_diff, seed_everything, weights_digest, write_result

import hvdkeras as hvd  # noqa: E402
from hvdkeras.training import xla  # noqa: E402
from hvdkeras.reduce.groups import gradient_buckets  # noqa: E402
from hvdkeras.reduce.options import default_bucket_bytes  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()
reduction_count = count_collectives()
RANK, SIZE = hvd.rank(), hvd.size()
B, STEPS = 8, 10


def data(steps=STEPS, per_worker=B, seed=1):
    rng = np.random.default_rng(seed)
    n = steps * per_worker * SIZE
    x = rng.normal(size=(n, 5)).astype("float32")
    y = np.stack([x[:, 0] * 2 - x[:, 1], x[:, 2] * x[:, 3], np.sin(x[:, 4])], axis=1).astype("float32")
    return x, y


def shard_rows(n_rows, per_worker):
    """Row indices of this rank's slice of every global batch of SIZE*per_worker rows."""
    g = per_worker * SIZE
    return np.concatenate([np.arange(k * g + RANK * per_worker, k * g + (RANK + 1) * per_worker)
                           for k in range(n_rows // g)])


def dense_model(seed=0):
    seed_everything(seed)
    inp = keras.Input((5,))
    h = keras.layers.Dense(16, activation="tanh")(inp)
    out = keras.layers.Dense(3)(h)
    return keras.Model(inp, out)


def make_opt(kind, lr_scale=1.0):
    if kind == "sgd":
        return keras.optimizers.SGD(0.05 * lr_scale, momentum=0.9)
    if kind == "plain_sgd":
        return keras.optimizers.SGD(0.05 * lr_scale)
    if kind == "adam":
        return keras.optimizers.Adam(0.01 * lr_scale)
    if kind == "adamw":
        return keras.optimizers.AdamW(0.01 * lr_scale, weight_decay=0.05)
    raise ValueError(kind)


def reference(kind, x, y, per_worker=B, lr_scale=1.0, model_fn=dense_model, loss="mse", jit_compile="auto"):
    model = model_fn()
    model.compile(optimizer=make_opt(kind, lr_scale), loss=loss, jit_compile=jit_compile)
    model.fit(x, y, batch_size=per_worker * SIZE, shuffle=False, epochs=1, verbose=0)
    return [v.numpy() for v in model.trainable_variables]


def distributed(kind, x, y, per_worker=B, model_fn=dense_model, loss="mse", callbacks=True, jit_compile="auto",
                **dist_kwargs):
    model = model_fn()
    opt = hvd.DistributedOptimizer(make_opt(kind), **dist_kwargs)
    model.compile(optimizer=opt, loss=loss, jit_compile=jit_compile)
    rows = shard_rows(len(x), per_worker)
    before = reduction_count()
    model.fit(x[rows], y[rows], batch_size=per_worker, shuffle=False, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)] if callbacks else [])
    calls = reduction_count() - before
    steps = len(rows) // per_worker
    return model, [v.numpy() for v in model.trainable_variables], calls / steps


result = {"rank": RANK, "size": SIZE}
x, y = data()

# Equivalence with the plain optimizer on the global batches.
for kind in ("sgd", "adam", "adamw"):
    model, w, calls_per_step = distributed(kind, x, y)
    ref = reference(kind, x, y)
    result[f"{kind}_max_abs_diff"] = max_abs_diff(w, ref)
    result[f"{kind}_digest"] = weights_digest(model.variables + model.optimizer.variables)
    result[f"{kind}_calls_per_step"] = calls_per_step

# fp16 compression.
model, w, _ = distributed("sgd", x, y, compression=hvd.Compression.fp16)
result["fp16_max_rel_diff"] = max_rel_diff(w, reference("sgd", x, y))
result["fp16_digest"] = weights_digest(model.trainable_variables)

# op=Sum: the summed gradient is SIZE times the mean, so it equals the reference at SIZE times the lr.
model, w, _ = distributed("plain_sgd", x, y, op=hvd.Sum)
result["sum_max_abs_diff"] = max_abs_diff(w, reference("plain_sgd", x, y, lr_scale=SIZE))

# gradient_predivide_factor.
model, w, _ = distributed("sgd", x, y, gradient_predivide_factor=2.0)
result["predivide_max_abs_diff"] = max_abs_diff(w, reference("sgd", x, y))

# The buckets: the tests run with HVDKERAS_BUCKET_BYTES=256, so this model's 4 gradients go in 2 buckets
# (bias 12 B + kernel 192 B + bias 64 B, then the first kernel's 320 B); bucket_bytes=0 is one call.
result["buckets_per_step"] = len(gradient_buckets([0, 1, 2, 3], dense_model().trainable_variables,
                                                 default_bucket_bytes()))
model, w, calls = distributed("sgd", x, y, bucket_bytes=0)
result["single_max_abs_diff"] = max_abs_diff(w, reference("sgd", x, y))
result["single_calls_per_step"] = calls

# groups: split the dense gradients into 2 fused calls.
model, w, calls = distributed("sgd", x, y, groups=2)
result["groups2_max_abs_diff"] = max_abs_diff(w, reference("sgd", x, y))
result["groups2_calls_per_step"] = calls

# backward_passes_per_step=2 with averaging: two local batches per update == one step on a 2x larger batch.
model, w, calls = distributed("sgd", x, y, backward_passes_per_step=2, average_aggregated_gradients=True)
result["bpps2_calls_per_step"] = calls
result["bpps2_iterations"] = int(model.optimizer.iterations.numpy())
result["bpps2_max_abs_diff"] = max_abs_diff(w, reference("sgd", x, y, per_worker=2 * B))
result["bpps2_digest"] = weights_digest(model.trainable_variables)


# Custom loop: tape.gradient then apply_gradients / apply.
def custom_loop(use_apply):
    model = dense_model()
    opt = hvd.DistributedOptimizer(make_opt("adam"))
    opt.build(model.trainable_variables)
    hvd.callbacks.broadcast.broadcast_model(model)  # same as the callback does in fit
    rows = shard_rows(len(x), B)
    xs, ys = x[rows], y[rows]

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        if use_apply:
            opt.apply(grads, model.trainable_variables)
        else:
            opt.apply_gradients(zip(grads, model.trainable_variables))

    for k in range(STEPS):
        step(xs[k * B:(k + 1) * B], ys[k * B:(k + 1) * B])
    return [v.numpy() for v in model.trainable_variables]


ref_adam = reference("adam", x, y)
result["custom_apply_gradients_max_abs_diff"] = max_abs_diff(custom_loop(False), ref_adam)
result["custom_apply_max_abs_diff"] = max_abs_diff(custom_loop(True), ref_adam)


# Sparse gradients from an Embedding: allgather (default) and sparse_as_dense.
def embedding_model():
    seed_everything(3)
    inp = keras.Input((4,), dtype="int32")
    h = keras.layers.Embedding(50, 6)(inp)
    h = keras.layers.GlobalAveragePooling1D()(h)
    return keras.Model(inp, keras.layers.Dense(3)(h))


rng = np.random.default_rng(7)
xe = rng.integers(0, 50, size=(STEPS * B * SIZE, 4)).astype("int32")
ye = rng.normal(size=(STEPS * B * SIZE, 3)).astype("float32")
ref_e = reference("sgd", xe, ye, model_fn=embedding_model)
for sad in (False, True):
    model, w, _ = distributed("sgd", xe, ye, model_fn=embedding_model, sparse_as_dense=sad)
    result[f"sparse_as_dense_{sad}_max_abs_diff"] = max_abs_diff(w, ref_e)

# XLA kept for the forward and backward pass (jit_compile=True): N workers equal one process running Keras's
# own compiled step on the global batches. "auto" is Keras's choice (off on a machine without a GPU).
def compiled(kind, label=None, **dist_kwargs):
    """`distributed` with jit_compile=True, recording whether XLA was kept, the calls per step and the digest."""
    model, w, calls = distributed(kind, x, y, jit_compile=True, **dist_kwargs)
    label = label or kind
    result[f"xla_{label}_kept"] = bool(model.jit_compile) and xla.is_split(model)
    result[f"xla_{label}_calls_per_step"] = calls
    result[f"xla_{label}_digest"] = weights_digest(model.variables + model.optimizer.variables)
    return model, w


for kind in ("sgd", "adam", "adamw"):
    model, w = compiled(kind)
    result[f"xla_{kind}_max_abs_diff"] = max_abs_diff(w, reference(kind, x, y, jit_compile=True))
    result[f"xla_{kind}_traced"] = xla.compiled_function(model).experimental_get_tracing_count()
model, w = compiled("sgd", "bpps2", backward_passes_per_step=2, average_aggregated_gradients=True)
result["xla_bpps2_max_abs_diff"] = max_abs_diff(w, reference("sgd", x, y, per_worker=2 * B, jit_compile=True))
result["xla_bpps2_iterations"] = int(model.optimizer.iterations.numpy())
model, w, _ = distributed("sgd", x, y, jit_compile="auto")
result["xla_auto_jit_after"] = bool(model.jit_compile)
result["xla_auto_max_abs_diff"] = max_abs_diff(w, reference("sgd", x, y))

# Mixed precision: rank 1's loss overflows on the 3rd step; every rank must skip that step together. Also with
# XLA kept, where the loss is scaled inside the compiled function and the finiteness check runs outside it.
for prefix, jit in (("mp", False), ("xla_mp", True)):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = dense_model()
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05))
        model.compile(optimizer=opt, loss="mse", jit_compile=jit)
        rows = shard_rows(len(x), B)
        xs = x[rows].copy()
        if RANK == SIZE - 1:
            xs[2 * B:3 * B] *= 1e6  # float16 activations overflow -> non-finite gradients on this rank only
        model.fit(xs, y[rows], batch_size=B, shuffle=False, epochs=1, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        result[f"{prefix}_kept"] = bool(model.jit_compile) and xla.is_split(model)
        # compile kept the distributed optimizer, whose inner LossScaleOptimizer scales the loss once
        result[f"{prefix}_is_loss_scale"] = (
            isinstance(model.optimizer.inner_optimizer, keras.optimizers.LossScaleOptimizer)
            and not isinstance(model.optimizer.inner_optimizer.inner_optimizer, keras.optimizers.LossScaleOptimizer))
        result[f"{prefix}_is_distributed"] = isinstance(model.optimizer, hvd.DistributedOptimizer)
        result[f"{prefix}_scale"] = float(model.optimizer.dynamic_scale.numpy())
        result[f"{prefix}_iterations"] = int(model.optimizer.iterations.numpy())
        result[f"{prefix}_digest"] = weights_digest(model.trainable_variables)
        result[f"{prefix}_finite"] = bool(all(np.isfinite(v.numpy()).all() for v in model.trainable_variables))
    finally:
        keras.mixed_precision.set_global_policy("float32")

write_result(RANK, result)
