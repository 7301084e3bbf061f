"""The digits CNN trained with a GradientTape loop and DistributedOptimizer (no fit).

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/custom_loop_digits.py
"""

import argparse

import keras
import tensorflow as tf
from _digits import cnn, load

import hvdkeras as hvd

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--steps", type=int, default=None, help="limit steps per epoch (smoke runs)")
args = parser.parse_args()

hvd.init()
(x_train, y_train), (x_val, y_val) = load()
train = hvd.data.shard((x_train, y_train), seed=0).batch(args.batch_size)
if args.steps:
    train = train.take(args.steps)

model = cnn()
optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_learning_rate(1e-3)))
optimizer.build(model.trainable_variables)
hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)  # identical start
loss_fn = keras.losses.SparseCategoricalCrossentropy()


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # all-reduced inside
    return loss


for epoch in range(args.epochs):
    losses = [float(train_step(x, y)) for x, y in train]
    mean_loss = float(hvd.allreduce(sum(losses) / len(losses)))
    correct = float(hvd.allreduce(
        tf.reduce_sum(tf.cast(tf.argmax(model(x_val[hvd.rank()::hvd.size()]), 1) == y_val[hvd.rank()::hvd.size()],
                              tf.float32)), op=hvd.Sum))
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1}: loss {mean_loss:.4f}, validation accuracy {correct / len(y_val):.4f}")
