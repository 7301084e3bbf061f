"""hvdkeras.reduce.allreduce: the reduction of dense, sparse and local gradients, in buckets, against the faked
seam (through DistributedOptimizer, whose default reducer it is)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import settings
from hvdkeras.training.optimizer import DistributedOptimizer

from ..helpers import small_model


def stack(widths=(4, 8, 16, 2)):
    """Dense layers of known sizes: kernel k has widths[k] * widths[k + 1] float32 entries."""
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((widths[0],))] + [keras.layers.Dense(w) for w in widths[1:]])


def ancestors(tensors) -> set:
    seen, todo = set(), [t.op for t in tensors]
    while todo:
        op = todo.pop()
        if op.name not in seen:
            seen.add(op.name)
            todo.extend(t.op for t in op.inputs)
            todo.extend(op.control_inputs)
    return seen


def test_sum_and_predivide(monkeypatch, fake_seam):
    seam = fake_seam.second_worker()
    model = small_model()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), op=C.Sum)
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    reduced = opt.reduce_gradients(grads, model.trainable_variables)
    np.testing.assert_allclose(reduced[0].numpy(), 4.0)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), gradient_predivide_factor=4.0)
    reduced = opt.reduce_gradients(grads, model.trainable_variables)
    np.testing.assert_allclose(reduced[0].numpy(), 2.0, rtol=1e-6)
    assert len(seam.calls) == 2


def test_fp16_compression_sends_half_and_restores_dtype(monkeypatch, fake_seam):
    seen = []

    def fake(tensors, **kwargs):  # noqa: ARG001
        seen.extend(t.dtype for t in tensors)
        return tensors

    fake_seam.set(grouped_allreduce=fake)
    from hvdkeras import Compression

    model = small_model()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), compression=Compression.fp16)
    out = opt.reduce_gradients([tf.ones_like(v) for v in model.trainable_variables], model.trainable_variables)
    assert seen == [tf.float16, tf.float16]
    assert [t.dtype for t in out] == [tf.float32, tf.float32]


def test_sparse_gradients_are_allgathered_and_averaged(monkeypatch, fake_seam):
    seam = fake_seam.second_worker()
    var = keras.Variable(np.zeros((5, 2), "float32"))
    grad = tf.IndexedSlices(tf.ones((2, 2)), tf.constant([1, 3]), dense_shape=tf.constant([5, 2]))
    opt = DistributedOptimizer(keras.optimizers.SGD(1.0))
    (out,) = opt.reduce_gradients([grad], [var])
    assert isinstance(out, tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(out).numpy()[[1, 3]], 1.0)  # 2 copies of 1, divided by 2
    assert seam.calls == [("allgather",), ("allgather",)]
    dense = DistributedOptimizer(keras.optimizers.SGD(1.0), sparse_as_dense=True)
    (out,) = dense.reduce_gradients([grad], [var])
    assert not isinstance(out, tf.IndexedSlices)
    assert seam.calls[-1][0] == "grouped_allreduce"


def test_local_variables_are_not_reduced_and_scaled_like_horovod(monkeypatch, fake_seam):
    seam = fake_seam.second_worker()
    model = small_model()
    kernel, bias = model.trainable_variables[-2:]
    for scale, factor in ((True, 0.5), (False, 1.0)):
        opt = DistributedOptimizer(keras.optimizers.SGD(1.0), scale_local_gradients=scale)
        opt.register_local_var(bias)
        grads = [tf.ones_like(v) for v in model.trainable_variables]
        out = opt.reduce_gradients(grads, model.trainable_variables)
        np.testing.assert_allclose(out[-1].numpy(), np.full(bias.shape, factor))  # local: grad / size, no seam
        np.testing.assert_allclose(out[-2].numpy(), np.full(kernel.shape, 2.0))   # reduced: 2x ours (fake)
    assert seam.calls[-1] == ("grouped_allreduce", len(grads) - 1, C.Average)


def test_gradients_are_reduced_in_buckets_in_backward_order(monkeypatch, fake_seam):
    seam = fake_seam.recording()
    model = stack()  # kernels 4x8 (128 B), 8x16 (512 B), 16x2 (128 B); biases 32, 64, 8 B
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    DistributedOptimizer(keras.optimizers.SGD(0.1), bucket_bytes=130).reduce_gradients(grads, model.trainable_variables)
    # From the last layer to the first; a bucket closes once it holds >= 130 bytes.
    assert seam.calls == [("hvdkeras.gradients.0", [(2,), (16, 2)]),
                          ("hvdkeras.gradients.1", [(16,), (8, 16)]),
                          ("hvdkeras.gradients.2", [(8,), (4, 8)])]
    seam.calls.clear()
    DistributedOptimizer(keras.optimizers.SGD(0.1), bucket_bytes=0).reduce_gradients(grads, model.trainable_variables)
    assert [len(shapes) for _, shapes in seam.calls] == [6]
    seam.calls.clear()
    DistributedOptimizer(keras.optimizers.SGD(0.1)).reduce_gradients(grads, model.trainable_variables)
    assert len(seam.calls) == 1, "the default (64 KiB) holds this whole model in one bucket"
    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", "1")
    settings.use(None)  # as a process started with it reads it
    seam.calls.clear()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
    opt.reduce_gradients(grads, model.trainable_variables)
    assert opt.bucket_bytes == 1 and len(seam.calls) == 6
    assert DistributedOptimizer.from_config(opt.get_config()).bucket_bytes == 1


def traced_step(model, opt, fake_seam, size=None):
    """Traces (never runs) a train step of `model` (stack()'s shapes) with `opt`, the seam recording each grouped
    allreduce's tensors by name; returns them and the name of the first kernel's gradient op."""
    sent, first_kernel_grad = {}, {}

    def grouped_allreduce(tensors, name=None, **kwargs):  # noqa: ARG001
        sent[name] = list(tensors)
        return [tf.identity(t) for t in tensors]

    fake_seam.set(size=size, grouped_allreduce=grouped_allreduce)
    opt.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        first_kernel_grad["op"] = grads[0].op.name
        opt.apply(grads, model.trainable_variables)

    step.get_concrete_function(tf.TensorSpec((8, 4)), tf.TensorSpec((8, 2)))
    return sent, first_kernel_grad["op"]


@pytest.mark.parametrize("bucket_bytes", [130, 0])
def test_a_bucket_can_start_before_the_rest_of_the_backward_pass_exists(monkeypatch, bucket_bytes, fake_seam):
    """The overlap is structural: in the traced train step, the last layer's bucket depends on none of the
    first layer's gradient ops, so the runtime can send it while it still computes them."""
    model = stack()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), bucket_bytes=bucket_bytes)
    sent, first_kernel_grad = traced_step(model, opt, fake_seam)
    last_bucket_needs = ancestors(sent["hvdkeras.gradients.0"])
    if bucket_bytes:
        assert first_kernel_grad not in last_bucket_needs
        assert len(sent) == 3
    else:
        assert first_kernel_grad in last_bucket_needs and len(sent) == 1
