"""Device-like compute for the network benchmark: a model whose layers take time but no core.

On a GPU host the compute runs on the device, and the host's cores stay free for Horovod's and NCCL's threads.
On this 2-core machine real compute fills the cores, so communication and compute compete for them. Here each
layer of a real model becomes a timed wait of that layer's measured time, forward and backward, holding
weights of the layer's own shapes (so the gradients' bytes, and their order, are the model's):

- `calibrate(model, x)` times each layer of a built Keras model on this machine, forward and backward (its
  gradients to its input and its weights), one compute thread as the benchmark's workers;
- `device_model(keras, model, times)` is the stand-in: one `TimedLayer` per layer, in order.

The waits are `tf.numpy_function(..., stateful=False)` sleeping in Python: a sleeping thread takes no core,
and a stateless op is not ordered by automatic control dependencies against the collectives (which are
stateful), so a bucket's allreduce can run while the next layer's backward waits, as on a device (being
stateless, a wait on constant inputs would be run once by grappler while optimizing; a batch never is). They need an
inter-op thread each while they wait: run the workers with inter-op threads to spare.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import tensorflow as tf


def timed_wait(x, seconds: float, outputs=()):
    """`x`, after waiting `seconds` without taking a core; with `outputs` (variables), also zeros of each one's
    shape made by the same op, so that they exist only once the wait is over.

    The zeros come out of the op itself: a gradient tied to the wait by arithmetic (adding 0 * x) or by a
    control dependency lets grappler fold the zeros into a constant and drop the wait."""
    shapes = [(tuple(v.shape), v.dtype.as_numpy_dtype) for v in outputs]

    def wait(value):
        time.sleep(seconds)
        return (value, *[np.zeros(shape, dtype) for shape, dtype in shapes])

    made = tf.numpy_function(wait, [x], [x.dtype, *[v.dtype for v in outputs]], stateful=False)
    made = list(made) if isinstance(made, (list, tuple)) else [made]
    for tensor, like in zip(made, [x, *outputs]):
        tensor.set_shape(like.shape)
    return made if outputs else made[0]


def timed_layer_class(keras):
    class TimedLayer(keras.layers.Layer):
        """Waits `forward_s` on the way in and `backward_s` on the way back; its weights' gradients exist only
        once its backward wait is over (zeros: the stand-in learns nothing, and is not meant to)."""

        def __init__(self, weight_shapes, forward_s, backward_s, **kwargs):
            super().__init__(**kwargs)
            self.weight_shapes = [tuple(s) for s in weight_shapes]
            self.forward_s, self.backward_s = float(forward_s), float(backward_s)

        def build(self, input_shape):
            self.kernels = [self.add_weight(shape=s, initializer="zeros", name=f"w{i}")
                            for i, s in enumerate(self.weight_shapes)]

        def call(self, x):
            forward_s, backward_s = self.forward_s, self.backward_s

            @tf.custom_gradient
            def timed(x, *weights):
                def grad(dy):
                    return tuple(timed_wait(dy, backward_s, weights)) if weights else timed_wait(dy, backward_s)

                return timed_wait(x, forward_s), grad

            return timed(x, *[tf.convert_to_tensor(k) for k in self.kernels])

    return TimedLayer


def calibrate(model, x, reps: int = 7) -> list[dict]:
    """Each layer's median forward and backward seconds on `x`, in order: [{name, forward_s, backward_s, shapes}].

    Forward: the layer's call on its real input, less an empty call's. Backward: its forward with its gradients
    to its input and weights, less the forward."""
    times, inp = [], tf.convert_to_tensor(x)
    # What calling a tf.function costs with no work in it, taken off each forward time (the backward time is a
    # difference of two calls, so it cancels there).
    empty = tf.function(lambda t: t)
    overhead = None
    for layer in model.layers:
        weights = layer.trainable_variables
        fwd_fn = tf.function(lambda t, layer=layer: layer(t, training=True))

        @tf.function
        def both(t, layer=layer, weights=weights):
            with tf.GradientTape() as tape:
                tape.watch(t)
                out = layer(t, training=True)
                total = tf.reduce_sum(out)
            return tape.gradient(total, [t, *weights])

        def median(fn, inp=inp):
            fn(inp)  # traced and warmed
            samples = []
            for _ in range(reps):
                start = time.perf_counter()
                result = fn(inp)
                tf.nest.map_structure(lambda r: r.numpy() if r is not None else None, result)
                samples.append(time.perf_counter() - start)
            return statistics.median(samples)

        if overhead is None:
            overhead = median(empty)
        forward_call = median(fwd_fn)
        forward = max(forward_call - overhead, 0.0)
        backward = max(median(both) - forward_call, 0.0)
        times.append({"name": layer.name, "forward_s": forward, "backward_s": backward,
                      "shapes": [list(w.shape) for w in weights]})
        inp = fwd_fn(inp)
    return times


def device_model(keras, times: list[dict], features: int):
    """The stand-in of a calibrated model: inputs and outputs of `features` values per example, one TimedLayer
    per layer of the real one, with its weights' shapes and its times."""
    TimedLayer = timed_layer_class(keras)
    layers = [keras.Input((features,))]
    layers += [TimedLayer(t["shapes"], t["forward_s"], t["backward_s"], name=f"timed_{i}_{t['name']}")
               for i, t in enumerate(times)]
    return keras.Sequential(layers)


def totals(times: list[dict]) -> dict:
    return {"forward_s": float(np.sum([t["forward_s"] for t in times])),
            "backward_s": float(np.sum([t["backward_s"] for t in times]))}
