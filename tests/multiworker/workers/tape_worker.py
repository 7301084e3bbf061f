"""DistributedGradientTape and Horovod's TF2 loop on 2 real workers.

- gradients: the tape's gradients, eager and in tf.function, on each rank's half of a global batch, equal the
  one-process gradients of the whole batch (computed here with a plain tape, no collectives);
- sparse: an Embedding's IndexedSlices gradient, allgathered, equals the average of the ranks' gradients;
- local: a PartialDistributedGradientTape keeps the local layer's gradient (divided by the size);
- once: a tape with op=Sum feeding a DistributedOptimizer(op=Sum): SGD(1.0) moves each weight by minus the
  sum of the ranks' gradients, not twice it;
- horovod_loop: Horovod's documented TF2 loop (a tf.function step, DistributedGradientTape, Adam, then
  broadcast_variables of model.variables and opt.variables() on the first batch), from initial weights that
  differ by rank and a batch that is each rank's shard of the global batch; the result is compared with one
  process training on the global batches from rank 0's initial weights, after the broadcast;
- seeded_loop: the same loop with the weights the same on every rank from the start (a seeded script), which
  then trains exactly as one process does.
"""

import numpy as np

from common import weights_digest, write_result

import hvdkeras as hvd  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
result = {"rank": rank, "size": size}
rng = np.random.default_rng(7)
GLOBAL_X = rng.normal(size=(8, 3)).astype("float32")
GLOBAL_Y = rng.normal(size=(8, 1)).astype("float32")
PER = len(GLOBAL_X) // size
MINE = slice(rank * PER, (rank + 1) * PER)


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])


def loss_of(model, x, y):
    return tf.reduce_mean((model(x, training=True) - y) ** 2)


# ------------------------------------------------------------------------------------------- gradients
model = make_model(1)
with tf.GradientTape() as plain:
    full = loss_of(model, GLOBAL_X, GLOBAL_Y)
expected = plain.gradient(full, model.trainable_variables)


def tape_grads():
    with tf.GradientTape() as tape:
        loss = loss_of(model, GLOBAL_X[MINE], GLOBAL_Y[MINE])
    return hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)


result["eager_grad_diff"] = max(float(np.max(np.abs(g - e))) for g, e in zip(tape_grads(), expected))
result["traced_grad_diff"] = max(float(np.max(np.abs(g - e))) for g, e in zip(tf.function(tape_grads)(), expected))

# ----------------------------------------------------------------------------------------------- sparse
emb = keras.layers.Embedding(6, 2)
emb.build((None,))
ids = tf.constant([[0, 1], [2, 3]][rank])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(emb(ids)) * (rank + 1)
sparse = hvd.DistributedGradientTape(tape).gradient(loss, emb.trainable_variables)[0]
result["sparse_is_indexed_slices"] = isinstance(sparse, tf.IndexedSlices)
# rank 0 sends 1 for rows 0 and 1, rank 1 sends 2 for rows 2 and 3; the average over 2 workers halves both.
result["sparse_dense"] = tf.convert_to_tensor(sparse).numpy()[:, 0]

# ------------------------------------------------------------------------------------------------ local
model = make_model(2)
with tf.GradientTape() as tape:
    loss = loss_of(model, GLOBAL_X[MINE], GLOBAL_Y[MINE])
own = tape.gradient(loss, model.trainable_variables)
with tf.GradientTape() as tape:
    loss = loss_of(model, GLOBAL_X[MINE], GLOBAL_Y[MINE])
partial = hvd.PartialDistributedGradientTape(tape, local_layers=model.layers[-1]).gradient(
    loss, model.trainable_variables)
result["local_kernel_diff"] = float(np.max(np.abs(partial[2] - own[2] / size)))
both = hvd.allreduce(own[0], op=hvd.Average)
result["shared_kernel_diff"] = float(np.max(np.abs(partial[0] - both)))

# ------------------------------------------------------------------------------------------------- once
v = tf.Variable([1.0, 1.0])
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvd.Sum)


@tf.function
def once_step():
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(v * float(rank + 1))
    grads = hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(y, [v])
    opt.apply_gradients(zip(grads, [v]))


once_step()
result["once_value"] = v.numpy()  # 1 - (1 + 2) = -2 on both ranks; reduced twice would be 1 - 2 * 3 = -5


# ----------------------------------------------------------------------------------------- horovod loop
def horovod_loop(model, steps=6):
    opt = keras.optimizers.Adam(0.01)

    @tf.function
    def training_step(x, y, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_of(model, x, y)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        return loss

    for step in range(steps):
        xs = np.roll(GLOBAL_X, step, axis=0)
        ys = np.roll(GLOBAL_Y, step, axis=0)
        training_step(xs[MINE], ys[MINE], step == 0)
    return model, opt


def one_process(model, steps):
    """One process on the global batches (no collectives), from `model`'s weights."""
    opt = keras.optimizers.Adam(0.01)
    for step in range(steps):
        xs, ys = np.roll(GLOBAL_X, step, axis=0), np.roll(GLOBAL_Y, step, axis=0)
        with tf.GradientTape() as tape:
            loss = loss_of(model, xs, ys)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return model


model = make_model(100 + rank)  # different initial weights on each rank, as an unseeded script has
initial = [w.numpy() for w in model.trainable_variables]
model, opt = horovod_loop(model)
result["loop_digest"] = weights_digest([v.numpy() for v in model.variables])
result["loop_opt_digest"] = weights_digest([v.numpy() for v in opt.variables])
result["initial_differs"] = bool(
    max(float(np.max(np.abs(a - b))) for a, b in zip(initial, hvd.allgather_object(initial)[1 - rank])) > 0)

# --------------------------------------------------------------------------------------------- seeded loop
model = make_model(5)  # the same on every rank: trains as one process from the start
horovod_loop(model)
reference = one_process(make_model(5), 6)
result["seeded_loop_diff"] = max(float(np.max(np.abs(a.numpy() - b.numpy())))
                                 for a, b in zip(model.trainable_variables, reference.trainable_variables))
write_result(rank, result)
