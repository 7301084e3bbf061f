"""The training loops the benchmarks time outside Keras's `fit`: Horovod's own DistributedGradientTape loop on
Keras 3 (the peer hvdkeras is compared with), and the same loop around any Keras 3 optimizer."""

import tensorflow as tf


def horovod_tape_step(model, optimizer, loss_fn):
    """A tf.function train step on one (x, y) batch: Horovod's DistributedGradientTape all-reduces the
    gradients, then the plain Keras 3 optimizer (already built) applies them. Returns the loss."""
    import horovod.tensorflow as htf

    @tf.function
    def step(batch):
        xb, yb = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = htf.DistributedGradientTape(tape)
        # Horovod's tape calls .ref() on its sources: give it the tf.Variables inside the Keras 3 ones.
        grads = tape.gradient(loss, [v.value for v in model.trainable_variables])
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def optimizer_step(model, optimizer, loss_fn):
    """The same step with a plain tape, the Keras 3 `optimizer` (already built; an hvdkeras DistributedOptimizer
    reduces the gradients in its `apply`) applying them: the loop above, with only the reduction changed."""

    @tf.function
    def step(batch):
        xb, yb = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return step
