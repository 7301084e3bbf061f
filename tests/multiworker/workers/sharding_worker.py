"""shard_optimizer_state=True on N real workers, in one launch.

- Gloo's reduce-scatter against allreduce + slice, bit for bit, over shapes, dtypes and repetitions.
- Sharded against unsharded DistributedOptimizer (both on N workers, same data) after 20 steps, per optimizer
  and per feature; the ranks' weights bit-identical; each rank holding only its part of the slots.
- Checkpoints: model.save gathers the full state (plain Keras, in another process without hvdkeras, loads
  it), and a sharded job that loads it resumes bitwise.
"""

import os
import subprocess
import sys

import numpy as np

from common import max_abs_diff, out_dir, seed_everything, weights_digest, write_result

import hvdkeras as hvd  # noqa: E402
from hvdkeras.training import xla  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from hvdkeras import _collectives as C  # noqa: E402
from hvdkeras.reduce.sharded_state import slots  # noqa: E402

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
B, STEPS = 8, 20
result = {"rank": RANK, "size": SIZE}

# ------------------------------------------------------------------ reduce-scatter against allreduce + slice
REPEATS = int(os.environ.get("HVDKERAS_TEST_RS_REPEATS", "20"))
shapes = [(SIZE * 4,), (SIZE * 4 + 1,), (SIZE * 3 + SIZE - 1, 5), (1, 7), (SIZE * 64 + 3, 33), (SIZE * 1000,)]
rng = np.random.default_rng(100 + RANK)
mismatches, compared = [], 0


def expected_rows(n):
    """This rank's rows of a first dimension of n: the first n % SIZE ranks get one more."""
    base, extra = divmod(n, SIZE)
    start = RANK * base + min(RANK, extra)
    return start, start + base + (1 if RANK < extra else 0)


try:
    C.reducescatter(tf.ones([SIZE], tf.bfloat16), op=C.Sum, name="t.rs.bfloat16.probe")
    result["rs_bfloat16"] = "supported"
except tf.errors.InvalidArgumentError as err:
    result["rs_bfloat16"] = str(err).splitlines()[0][:200]
for dtype in (tf.float32, tf.float16, tf.bfloat16):
    if dtype == tf.bfloat16 and result["rs_bfloat16"] != "supported":
        continue
    for rep in range(REPEATS):
        tensors = [tf.cast(rng.normal(size=s).astype("float32") * 10.0 ** rng.integers(-3, 4), dtype) for s in shapes]
        alone = [C.reducescatter(t, op=C.Sum, name=f"t.rs.{dtype.name}.{i}") for i, t in enumerate(tensors)]
        grouped = C.grouped_reducescatter(tensors, op=C.Sum, name=f"t.grs.{dtype.name}")
        summed = C.grouped_allreduce(tensors, op=C.Sum, name=f"t.ar.{dtype.name}")
        for i, (a, g, s) in enumerate(zip(alone, grouped, summed)):
            lo, hi = expected_rows(s.shape[0])
            want = s[lo:hi].numpy().view(np.uint16 if dtype != tf.float32 else np.uint32)
            for how, got in (("alone", a), ("grouped", g)):
                compared += 1
                bits = got.numpy().view(want.dtype)
                if got.shape != want.shape or not np.array_equal(bits, want):
                    mismatches.append(f"{how} {dtype.name} {shapes[i]} repeat {rep}")
result["rs_compared"] = compared
result["rs_mismatches"] = mismatches

# --------------------------------------------------------------------------------------------- equivalence
def data(steps=STEPS, seed=1):
    rng = np.random.default_rng(seed)
    n = steps * B * SIZE
    x = rng.normal(size=(n, 6)).astype("float32")
    y = np.stack([x[:, 0] * 2 - x[:, 1], x[:, 2] * x[:, 3], np.sin(x[:, 4] + x[:, 5])], axis=1).astype("float32")
    g = B * SIZE
    rows = np.concatenate([np.arange(k * g + RANK * B, k * g + (RANK + 1) * B) for k in range(n // g)])
    return x[rows], y[rows]


def model_fn(seed=0):
    seed_everything(seed)
    inp = keras.Input((6,))
    h = keras.layers.Dense(64, activation="tanh")(inp)
    h = keras.layers.Dense(128, activation="tanh")(h)  # 8,192 of the 10,883 parameters: cut into pieces
    h = keras.layers.Dense(16, activation="tanh")(h)
    out = keras.layers.Dense(3, dtype="float32")(h)
    return keras.Model(inp, out)


def embedding_model_fn(seed=0):
    """An embedding of 256 x 16 (4,096 of the model's 4,291 parameters), whose gradient is sparse."""
    seed_everything(seed)
    inp = keras.Input((4,), dtype="int32")
    h = keras.layers.Flatten()(keras.layers.Embedding(256, 16)(inp))
    out = keras.layers.Dense(3)(h)
    return keras.Model(inp, out)


def tokens(x):
    return (np.abs(x[:, :4]) * 67).astype("int32") % 256


def adamw_excluding_biases():
    opt = keras.optimizers.AdamW(0.01, weight_decay=0.05)
    opt.exclude_from_weight_decay(var_names=["bias"])
    return opt


def schedule():
    return keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=5, decay_rate=0.7)


KINDS = {
    "sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.005),
    "adafactor": lambda: keras.optimizers.Adafactor(0.05),
    "clipnorm": lambda: keras.optimizers.Adam(0.01, clipnorm=0.05),
    "global_clipnorm": lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.05),
    "ema": lambda: keras.optimizers.Adam(0.01, use_ema=True, ema_overwrite_frequency=7),
    "schedule": lambda: keras.optimizers.Adam(schedule()),
    "bpps2": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "mixed_float16": lambda: keras.optimizers.Adam(0.01),
    "xla": lambda: keras.optimizers.Adam(0.01),  # jit_compile=True: XLA kept for the forward and backward pass
    "adamw_excluded": adamw_excluding_biases,  # the biases, excluded from the decay, are owned whole
    "embedding": lambda: keras.optimizers.Adam(0.01),  # sparse gradients of an embedding cut into rows
    "embedding_whole": lambda: keras.optimizers.Adam(0.01, clipnorm=0.05),  # owned whole by one worker
    "nadam": lambda: keras.optimizers.Nadam(0.01),
}


def train(kind, shard, x, y, steps=None, model=None):
    if kind == "mixed_float16":
        keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        extra = {"backward_passes_per_step": 2} if kind == "bpps2" else {}
        if model is None:
            model = embedding_model_fn() if kind.startswith("embedding") else model_fn()
            opt = hvd.DistributedOptimizer(KINDS[kind](), shard_optimizer_state=shard, **extra)
            model.compile(optimizer=opt, loss="mse", jit_compile=kind == "xla")
        n = len(x) if steps is None else steps * B
        inputs = tokens(x[:n]) if kind.startswith("embedding") else x[:n]
        model.fit(inputs, y[:n], batch_size=B, shuffle=False, epochs=1, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model


def sums(values):
    """Each array's sum of absolute values: what two copies of one state are compared by."""
    return [float(np.sum(np.abs(np.asarray(v, dtype="float64")))) for v in values]


def elements(variables):
    return int(sum(np.prod(v.shape) for v in variables))


x, y = data()
for kind in KINDS:
    plain = train(kind, False, x, y)
    sharded = train(kind, True, x, y)
    weights = [v.numpy() for v in sharded.trainable_variables]
    result[f"{kind}_max_abs_diff"] = max_abs_diff(weights, [v.numpy() for v in plain.trainable_variables])
    result[f"{kind}_digest"] = weights_digest(weights)
    result[f"{kind}_xla_kept"] = [xla.is_split(m) and bool(m.jit_compile) for m in (plain, sharded)]
    opt = sharded.optimizer
    result[f"{kind}_slot_elements"] = elements(opt.shard_variables())
    shard = opt.reducer.shard
    result[f"{kind}_split"] = [v.name for i, v in enumerate(shard.variables) if shard.split(i)]
    result[f"{kind}_plain_slot_elements"] = elements(slots(plain.optimizer.inner_optimizer))
    gathered = opt.gather_state()
    full = [v.numpy() for v in plain.optimizer.inner_optimizer.variables]
    result[f"{kind}_state_count"] = [len(gathered), len(full)]
    result[f"{kind}_state_max_abs_diff"] = max(
        (float(np.max(np.abs(a.astype("float64") - b.astype("float64")))) for a, b in zip(gathered, full)
         if np.size(a)), default=0.0)
    result[f"{kind}_iterations"] = [int(opt.iterations.numpy()), int(plain.optimizer.iterations.numpy())]

# ------------------------------------------------------------------------------------------------ checkpoints
path = os.path.join(out_dir(), "sharded.keras" if RANK == 0 else f"scratch-{RANK}.keras")
model = train("adam", True, x, y, steps=STEPS // 2)
model.save(path)  # every rank: the gather is collective; rank 0 keeps the file
saved_state = model.optimizer.gather_state()
result["saved_sums"] = sums(saved_state)
model = train("adam", True, x[STEPS // 2 * B:], y[STEPS // 2 * B:], model=model)
whole = [v.numpy() for v in model.trainable_variables]

restored = hvd.load_model(path if RANK == 0 else path, shard_optimizer_state=True)
result["restored_iterations"] = int(restored.optimizer.iterations.numpy())
restored = train("adam", True, x[STEPS // 2 * B:], y[STEPS // 2 * B:], model=restored)
result["restored_sharded"] = restored.optimizer.sharded
resumed = [v.numpy() for v in restored.trainable_variables]
result["resumed_bitwise"] = all(np.array_equal(a, b) for a, b in zip(whole, resumed))
result["resumed_max_abs_diff"] = max_abs_diff(whole, resumed)

# A rank-0-only save without consolidate_state is refused, clearly, instead of waiting for the others.
if RANK == 0:
    from hvdkeras.training import rank_zero

    try:
        with rank_zero.solo():
            model.save(os.path.join(out_dir(), "refused.keras"))
        result["solo_save_error"] = None
    except RuntimeError as err:
        result["solo_save_error"] = str(err)

# consolidate_state, then rank 0 alone saves: the Horovod idiom.
model.optimizer.consolidate_state()
result["consolidated_sums"] = sums(model.optimizer.reducer.optimizer_state._gathered)
if RANK == 0:
    model.save(os.path.join(out_dir(), "rank0-only.keras"))
C.barrier()

# ModelCheckpoint (every rank) and BackupAndRestore: an interrupted sharded run resumes bitwise.
class Stop(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise KeyboardInterrupt("stop after epoch 2")


def epochs_run(epochs, callbacks, model=None):
    model = model or model_fn()
    if getattr(model, "optimizer", None) is None:
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), shard_optimizer_state=True),
                      loss="mse")
    model.fit(x, y, batch_size=B, shuffle=False, epochs=epochs, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks])
    return model


backup = os.path.join(out_dir(), "backup")
checkpoint = hvd.callbacks.ModelCheckpoint(os.path.join(out_dir(), "ckpt-{epoch}.keras"))
uninterrupted = epochs_run(4, [checkpoint])
result["checkpoint_state_sums"] = sums(uninterrupted.optimizer.gather_state())
try:
    epochs_run(4, [hvd.callbacks.BackupAndRestore(backup), Stop()])
except KeyboardInterrupt:
    pass
resumed_model = epochs_run(4, [hvd.callbacks.BackupAndRestore(backup)])
result["backup_resumed_bitwise"] = all(np.array_equal(a.numpy(), b.numpy()) for a, b in
                                       zip(uninterrupted.trainable_variables, resumed_model.trainable_variables))
result["backup_resumed_iterations"] = int(resumed_model.optimizer.iterations.numpy())
result["backup_state_max_abs_diff"] = max(
    float(np.max(np.abs(a.astype("float64") - b.astype("float64")))) if np.size(a) else 0.0
    for a, b in zip(uninterrupted.optimizer.gather_state(), resumed_model.optimizer.gather_state()))

if RANK == 0:
    ckpt = os.path.join(out_dir(), "ckpt-4.keras")
    probe = (
        "import json, sys, numpy as np, keras\n"
        "m = keras.models.load_model(sys.argv[1])\n"
        "print(json.dumps({'type': type(m.optimizer).__name__, 'n': len(m.optimizer.variables),\n"
        "  'hvdkeras': 'hvdkeras' in sys.modules,\n"
        "  'sums': [float(np.sum(np.abs(np.asarray(v, dtype='float64')))) for v in m.optimizer.variables]}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD", "OMPI", "PMI"))}
    import json

    for key, file in (("plain_load", path), ("checkpoint_load", ckpt),
                      ("rank0_only_load", os.path.join(out_dir(), "rank0-only.keras"))):
        out = subprocess.run([sys.executable, "-c", probe, file], capture_output=True, text=True, timeout=120, env=env)
        result[key] = (json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0
                       else {"error": out.stderr[-3000:]})
write_result(RANK, result)
