"""The "loops" patch in one process, the seam faked as two workers: every Keras optimizer's update reduces its
gradients once, at the outermost optimizer, and broadcasts before its first update; XLA is refused."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import collectives, loops


@pytest.fixture
def two_workers(hvd, monkeypatch):
    """Size 2 as far as the loops patch can tell; the reductions and broadcasts counted (values unchanged)."""
    calls = {"reduce": [], "broadcast": 0}
    grouped = C.grouped_allreduce

    def grouped_allreduce(tensors, *args, **kwargs):
        calls["reduce"].append(kwargs.get("name"))
        return grouped(tensors, *args, **kwargs)

    def broadcast_variables(variables, root_rank=0, **kwargs):
        calls["broadcast"] += 1

    monkeypatch.setattr(C, "size", lambda: 2)
    monkeypatch.setattr(C, "grouped_allreduce", grouped_allreduce)
    monkeypatch.setattr(collectives, "broadcast_variables", broadcast_variables)
    loops.install()
    yield calls
    loops.uninstall()


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    return model


X = np.ones((4, 3), "float32")


def _grads(model):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(X) ** 2)
    return tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("traced", [False, True])
def test_plain_optimizer_reduces_and_broadcasts_before_its_first_update(two_workers, traced):
    model, opt = _model(), keras.optimizers.Adam()

    def step():
        opt.apply_gradients(zip(_grads(model), model.trainable_variables))

    step = tf.function(step) if traced else step
    step()
    traced_calls = len(two_workers["reduce"])
    step()
    step()
    assert two_workers["broadcast"] == 1
    assert set(two_workers["reduce"]) == {"hvdkeras.loop.0.0"}
    # eagerly one reduction per step; traced, the reduction is in the graph and nothing runs again in Python
    assert len(two_workers["reduce"]) == (traced_calls if traced else 3)
    assert int(opt.iterations) == 3


def test_loss_scale_optimizer_reduces_at_the_outermost_optimizer_once(two_workers):
    model = _model()
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    opt.apply(_grads(model), model.trainable_variables)
    assert len(two_workers["reduce"]) == 1 and two_workers["broadcast"] == 1


def test_distributed_optimizer_and_tape_gradients_are_not_reduced_again(two_workers, hvd):
    model = _model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    opt.apply(_grads(model), model.trainable_variables)
    assert all(name.startswith("hvdkeras.gradients.") for name in two_workers["reduce"])
    assert two_workers["broadcast"] == 0  # a DistributedOptimizer is the script's (or fit's callbacks') to sync
    two_workers["reduce"].clear()
    plain = keras.optimizers.SGD(0.1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(X) ** 2)
    grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    plain.apply_gradients(zip(grads, model.trainable_variables))
    assert all(name.startswith("hvdkeras.tape.") for name in two_workers["reduce"])


def test_an_update_inside_xla_is_refused(two_workers):
    model, opt = _model(), keras.optimizers.SGD(0.1)

    @tf.function(jit_compile=True)
    def step():
        opt.apply_gradients(zip(_grads(model), model.trainable_variables))

    with pytest.raises(RuntimeError, match="inside tf.function\\(jit_compile=True\\).*jit_compile=False"):
        step()


def test_one_worker_and_uninstalled_change_nothing(hvd, monkeypatch):
    calls = []
    monkeypatch.setattr(collectives, "broadcast_variables", lambda *a, **k: calls.append(1))
    loops.install()
    try:
        model, opt = _model(), keras.optimizers.SGD(0.1)
        opt.apply(_grads(model), model.trainable_variables)  # size 1: Keras's own apply
    finally:
        loops.uninstall()
    assert calls == []
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    assert not hasattr(BaseOptimizer.apply, "__wrapped__")
