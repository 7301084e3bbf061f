"""Throughput of a keras.applications model (weights=None) on synthetic images, data-parallel.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/synthetic_benchmark.py --model ResNet50

Prints images/sec per worker and in total (mean +- 1.96 std over iterations, after warm-up).
"""

import argparse
import time

import keras
import numpy as np
import tensorflow as tf

import hvdkeras as hvd

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--model", default="ResNet50", help="a keras.applications model name")
parser.add_argument("--batch-size", type=int, default=32, help="per worker")
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--num-warmup-batches", type=int, default=5)
parser.add_argument("--num-batches-per-iter", type=int, default=5)
parser.add_argument("--num-iters", type=int, default=5)
args = parser.parse_args()

hvd.init()
model_fn = getattr(keras.applications, args.model, None)
if model_fn is None:
    raise SystemExit(f"--model must name a keras.applications model. Received: --model {args.model!r}")
model = model_fn(weights=None, input_shape=(args.image_size, args.image_size, 3), classes=1000)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01), compression=compression)
optimizer.build(model.trainable_variables)
hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)
loss_fn = keras.losses.SparseCategoricalCrossentropy()
data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
target = tf.random.uniform([args.batch_size], minval=0, maxval=999, dtype=tf.int64)


@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = loss_fn(target, model(data, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


for _ in range(args.num_warmup_batches):
    step()
rates = []
for _ in range(args.num_iters):
    start = time.perf_counter()
    for _ in range(args.num_batches_per_iter):
        step()
    rates.append(args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start))
mean, conf = float(np.mean(rates)), float(1.96 * np.std(rates))
total = float(hvd.allreduce(mean, op=hvd.Sum))
if hvd.rank() == 0:
    print(f"Model: {args.model}, batch size {args.batch_size} per worker, {hvd.size()} workers")
    print(f"Img/sec per worker: {mean:.1f} +-{conf:.1f}")
    print(f"Total img/sec on {hvd.size()} worker(s): {total:.1f}")
