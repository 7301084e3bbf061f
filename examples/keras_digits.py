"""A small CNN on the bundled digits, trained data-parallel with the explicit hvdkeras API.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/keras_digits.py   (what `make demo` runs)

Every worker trains on its shard of each global batch; gradients are averaged with one allreduce per step.
"""

import argparse
import json
import os

import keras
import tensorflow as tf
from _digits import cnn, load

import hvdkeras as hvd

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=32, help="per worker; the global batch is size() times it")
parser.add_argument("--lr", type=float, default=1e-3, help="single-worker learning rate, scaled linearly")
parser.add_argument("--warmup-epochs", type=float, default=2)
parser.add_argument("--out-dir", default="digits_out")
parser.add_argument("--steps", type=int, default=None, help="limit steps per epoch (smoke runs)")
parser.add_argument("--history-out", default=None, help="write the per-epoch history (JSON) here, on rank 0")
args = parser.parse_args()

hvd.init()
(x_train, y_train), (x_val, y_val) = load()
train = hvd.data.shard(tf.data.Dataset.from_tensor_slices((x_train, y_train)), seed=0).batch(args.batch_size)
# Validation needs no equal steps; every worker takes its part and MetricAverageCallback combines them exactly.
val = tf.data.Dataset.from_tensor_slices((x_val, y_val)).shard(hvd.size(), hvd.rank()).batch(256)
if args.steps:
    train = train.take(args.steps)

lr = hvd.scale_learning_rate(args.lr)  # x size(): the global batch is size() times larger
model = cnn()
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(lr)),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
checkpoint = os.path.join(args.out_dir, "digits-{epoch:02d}.keras")
# shuffle=False: the shard above shuffles, anew each epoch (for a dataset Keras ignores `shuffle`, and warns if True).
history = model.fit(
    train, validation_data=val, epochs=args.epochs, verbose=2, shuffle=False,
    callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=args.warmup_epochs),
        hvd.callbacks.ModelCheckpoint(checkpoint),
    ],
)
final = checkpoint.format(epoch=args.epochs)
if hvd.rank() == 0:
    if args.history_out:
        with open(args.history_out, "w") as f:
            json.dump({k: [float(v) for v in vals] for k, vals in history.history.items()}, f)
    print(f"validation accuracy {history.history['val_accuracy'][-1]:.4f} on {hvd.size()} workers; "
          f"model saved to {final}")
