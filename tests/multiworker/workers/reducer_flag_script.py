"""An unmodified Keras script, run with `--reducer` (test_reducer_flags_2w.py): a model.fit, then a GradientTape
loop of its own. Each rank feeds its own rows only through hvdkeras's split of the data. Writes rank<R>.json into
the folder given as the first argument: both models' weights digests, and the reducer hvdkeras gave the loop's
optimizer (read from it, as a test may)."""

import hashlib
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

rank = int(os.environ.get("HOROVOD_RANK", "0"))
out = sys.argv[1]
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 6)).astype("float32")
y = (x @ rng.normal(size=(6, 4))).astype("float32")


def digest(variables):
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(np.asarray(v)).tobytes())
    return h.hexdigest()


def model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(32, activation="tanh"),
                             keras.layers.BatchNormalization(), keras.layers.Dense(4)])


fitted = model()
fitted.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
fitted.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)  # 8 updates: a multiple of the period

looped = model()
opt = keras.optimizers.SGD(0.05)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)


@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(looped(xb, training=True) - yb))
    opt.apply_gradients(zip(tape.gradient(loss, looped.trainable_variables), looped.trainable_variables))


for _ in range(2):
    for xb, yb in data:
        step(xb, yb)
result = {"fit": digest(fitted.trainable_variables), "fit_stats": digest(fitted.non_trainable_variables),
          "loop": digest(looped.trainable_variables), "loop_steps": int(opt.iterations.numpy()),
          "loop_reducer": repr(opt.__dict__.get("_hvdkeras_reducer"))}
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
