"""DistributedGradientTape in one process: Horovod's parameters, Keras 3 and tf variables, dense and sparse
gradients, eager and tf.function, what it passes through, and that a DistributedOptimizer does not reduce its
gradients again (the collectives seam counted)."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.reduce import context as reduction


@pytest.fixture
def counted(monkeypatch):
    """Every grouped allreduce and allgather the seam is asked for, by name (size 1: values unchanged)."""
    calls = []
    grouped, gather = C.grouped_allreduce, C.allgather

    def grouped_allreduce(tensors, *args, **kwargs):
        calls.append(("allreduce", kwargs.get("name"), len(list(tensors))))
        return grouped(tensors, *args, **kwargs)

    def allgather(tensor, *args, **kwargs):
        calls.append(("allgather", kwargs.get("name"), 1))
        return gather(tensor, *args, **kwargs)

    monkeypatch.setattr(C, "grouped_allreduce", grouped_allreduce)
    monkeypatch.setattr(C, "allgather", allgather)
    return calls


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.build((None, 3))
    return model


def _loss(model, x):
    return tf.reduce_mean(model(x) ** 2)


X = np.arange(12, dtype="float32").reshape(4, 3) / 10


def test_horovod_signature(hvd):
    import horovod.tensorflow as horovod_tf

    for name in ("DistributedGradientTape", "PartialDistributedGradientTape"):
        theirs = inspect.signature(getattr(horovod_tf, name)).parameters
        ours = inspect.signature(getattr(hvd, name)).parameters
        assert list(ours)[:len(theirs)] == list(theirs), name
        for key, param in theirs.items():
            if key in ("compression", "process_set"):
                continue
            assert ours[key].default == param.default, (name, key)
        assert ours["compression"].default is hvd.Compression.none
        assert ours["process_set"].default is hvd.global_process_set


@pytest.mark.parametrize("traced", [False, True])
def test_keras_variables_eager_and_traced(hvd, counted, traced):
    model = _model()

    def grads():
        with tf.GradientTape() as tape:
            loss = _loss(model, X)
        tape = hvd.DistributedGradientTape(tape)
        return tape.gradient(loss, model.trainable_variables)

    with tf.GradientTape() as plain:
        loss = _loss(model, X)
    expected = plain.gradient(loss, model.trainable_variables)
    got = tf.function(grads)() if traced else grads()
    assert isinstance(got, list) and len(got) == 4
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6)
    assert counted and all(kind == "allreduce" and name.startswith("hvdkeras.tape.") for kind, name, _ in counted)


def test_tf_variables_nested_sources_output_gradients_and_unconnected(hvd, counted):
    a, b, unused = tf.Variable([1.0, 2.0]), tf.Variable(3.0), tf.Variable([5.0])
    with tf.GradientTape(persistent=True) as tape:
        y = a * b
    tape = hvd.DistributedGradientTape(tape)
    got = tape.gradient(y, {"a": a, "b": [b, unused]}, output_gradients=tf.constant([1.0, 10.0]))
    np.testing.assert_allclose(got["a"], [3.0, 30.0])
    np.testing.assert_allclose(got["b"][0], 1.0 * 1 + 10.0 * 2)
    assert got["b"][1] is None
    zeros = tape.gradient(y, [unused], unconnected_gradients=tf.UnconnectedGradients.ZERO)
    np.testing.assert_allclose(zeros[0], [0.0])
    np.testing.assert_allclose(tape.gradient(y, a), [3.0, 3.0])  # a single source: a single gradient


def test_watched_tensor_of_unknown_batch(hvd):
    @tf.function(input_signature=[tf.TensorSpec([None, 2])])
    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(x * x)
        return hvd.DistributedGradientTape(tape).gradient(y, x)

    np.testing.assert_allclose(grad(tf.constant([[1.0, 2.0], [3.0, 4.0]])), [[2.0, 4.0], [6.0, 8.0]])


def test_indexed_slices_allgathered_or_dense(hvd, counted):
    emb = keras.layers.Embedding(10, 2)
    ids = tf.constant([1, 3, 3])

    def grad(**options):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(emb(ids))
        return hvd.DistributedGradientTape(tape, **options).gradient(loss, emb.trainable_variables)[0]

    sparse = grad()
    assert isinstance(sparse, tf.IndexedSlices)
    assert [k for k, _, _ in counted] == ["allgather", "allgather"]
    dense = grad(sparse_as_dense=True)
    assert not isinstance(dense, tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(sparse), dense)
    np.testing.assert_allclose(dense[3], [2.0, 2.0])


def test_context_manager_form_and_delegation(hvd):
    v = tf.Variable(2.0)
    with hvd.DistributedGradientTape(tf.GradientTape(persistent=True)) as tape:
        y = v * v
        with tape.stop_recording():
            _ = v * 3.0
    assert isinstance(tape, tf.GradientTape)
    assert [w.name for w in tape.watched_variables()] == [v.name]
    np.testing.assert_allclose(tape.gradient(y, [v])[0], 4.0)
    np.testing.assert_allclose(tape.jacobian(y, v), 4.0)


def test_local_sources_and_partial_tape(hvd, counted):
    model = _model()
    first, last = model.layers
    with tf.GradientTape(persistent=True) as tape:
        loss = _loss(model, X)
    partial = hvd.PartialDistributedGradientTape(tape, local_layers=last)
    partial.gradient(loss, model.trainable_variables)
    assert sum(n for _, _, n in counted) == 2  # the first layer's kernel and bias only
    counted.clear()
    dist = hvd.DistributedGradientTape(tape)
    dist.register_local_source(first.kernel)
    dist.gradient(loss, model.trainable_variables)
    assert sum(n for _, _, n in counted) == 3
    with pytest.raises(TypeError, match="Received: source='kernel'"):
        dist.register_local_source("kernel")
    with pytest.raises(ValueError, match="`local_layers` must be Keras layers. Received: local_layers="):
        hvd.PartialDistributedGradientTape(tape, local_layers=[first.kernel])


def test_bad_input(hvd):
    with pytest.raises(TypeError, match="must be a tf.GradientTape.*Received: gradtape=.*of type str"):
        hvd.DistributedGradientTape("tape")
    tape = hvd.DistributedGradientTape(tf.GradientTape())
    with pytest.raises(ValueError, match="already a DistributedGradientTape"):
        hvd.DistributedGradientTape(tape)
    with pytest.raises(ValueError, match="Received: op=Max"):
        hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Max)
    with pytest.raises(ValueError, match="not both"):
        hvd.DistributedGradientTape(tf.GradientTape(), num_groups=2, groups=2)


def test_refused_inside_xla(hvd):
    v = tf.Variable(1.0)

    @tf.function(jit_compile=True)
    def step():
        with tf.GradientTape() as tape:
            y = v * v
        return hvd.DistributedGradientTape(tape).gradient(y, [v])

    with pytest.raises(RuntimeError, match="cannot be compiled by XLA.*DistributedGradientTape.gradient"):
        step()


@pytest.mark.parametrize("traced", [False, True])
def test_tape_then_distributed_optimizer_reduces_once(hvd, counted, traced):
    model = _model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum)

    def step():
        with tf.GradientTape() as tape:
            loss = _loss(model, X)
        tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    (tf.function(step) if traced else step)()
    names = [name for _, name, _ in counted]
    assert names and all(name.startswith("hvdkeras.tape.") for name in names), names
    # A gradient the script computes itself is reduced by the optimizer as usual.
    counted.clear()
    with tf.GradientTape() as tape:
        loss = _loss(model, X)
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    assert counted and all(name.startswith("hvdkeras.gradients.") for _, name, _ in counted)


def test_reduced_registry_is_weak_and_exact():
    t = tf.constant([1.0])
    assert not reduction.is_reduced(t) and not reduction.is_reduced(None)
    reduction._reduced[id(t)] = t
    assert reduction.is_reduced(t) and not reduction.is_reduced(tf.constant([1.0]))
    key = id(t)
    del t
    assert key not in reduction._reduced


def test_two_tapes_get_distinct_stable_names(hvd, counted):
    a, b = _model(), _model()
    for _ in range(2):
        for model in (a, b):
            with tf.GradientTape() as tape:
                loss = _loss(model, X)
            hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    names = [name for _, name, _ in counted]
    half = len(names) // 2
    assert names[:half] == names[half:]  # the same names from step to step
    prefixes = {name.rsplit(".", 1)[0] for name in names}
    assert len(prefixes) == 2  # one per model


def test_optimizer_variables_may_be_called_as_in_keras_2(hvd):
    for opt in (keras.optimizers.Adam(), keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
                hvd.DistributedOptimizer(keras.optimizers.Adam())):
        opt.build([keras.Variable(np.zeros(2, "float32"))])
        assert isinstance(opt.variables, list) and opt.variables() == list(opt.variables)
        assert len(opt.variables) > 0


def test_broadcast_variables_inside_tf_function(hvd):
    model = _model()
    opt = keras.optimizers.Adam()
    opt.build(model.trainable_variables)
    before = [v.numpy() for v in model.variables + opt.variables]

    @tf.function
    def broadcast():
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)

    broadcast()
    for v, b in zip(model.variables + opt.variables, before):
        np.testing.assert_array_equal(v.numpy(), b)
