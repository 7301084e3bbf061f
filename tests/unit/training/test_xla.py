"""hvdkeras.training.xla and models.prepare_xla: XLA kept for the forward and backward pass, the gradients reduced and
applied outside, in one process (the 2-worker equivalence is in tests/multiworker/test_optimizer_2w.py)."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import wrap
from hvdkeras.callbacks import BroadcastGlobalVariablesCallback
from hvdkeras.training import models, xla
from hvdkeras.training.optimizer import DistributedOptimizer
from hvdkeras.training.sync_batch_norm import SyncBatchNormalization


def mlp():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="gelu"), keras.layers.Dense(3)])


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 6)).astype("float32"), rng.normal(size=(64, 3)).astype("float32")


def train(model, optimizer, callbacks=(), jit_compile=True, epochs=2):
    x, y = data()
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"], jit_compile=jit_compile)
    history = model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=list(callbacks))
    return [v.numpy() for v in model.trainable_variables], history.history


def max_diff(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b))


@pytest.mark.parametrize("kind", ["sgd", "adam", "mixed_float16", "bpps2"])
def test_kept_xla_trains_as_keras_compiled_step_does(hvd, kind):
    def optimizer():
        return keras.optimizers.SGD(0.05, momentum=0.9) if kind == "sgd" else keras.optimizers.Adam(0.01)

    if kind == "mixed_float16":
        keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        ref_w, ref_h = train(mlp(), optimizer())
        model = mlp()
        dist = DistributedOptimizer(optimizer(), backward_passes_per_step=2 if kind == "bpps2" else 1,
                                    average_aggregated_gradients=True)
        w, h = train(model, dist, [BroadcastGlobalVariablesCallback(0)])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.jit_compile is True and xla.is_split(model)
    compiled = xla.compiled_function(model)
    assert compiled.experimental_get_tracing_count() >= 1  # the forward and backward pass ran compiled
    # The inner optimizer's update, after the reduction, compiled too: one function for the one variable list.
    assert model.optimizer.xla_update is True and len(model.optimizer._compiled_updates) == 1
    if kind == "bpps2":
        # Two local batches per update: four updates over the 8 batches, as in Horovod.
        assert int(model.optimizer.iterations.numpy()) == 8
        return
    print(f"{kind}: max abs weight difference from Keras's compiled step {max_diff(w, ref_w):.1e}")
    assert max_diff(w, ref_w) <= 1e-6
    for key in ("loss", "mae"):
        np.testing.assert_allclose(h[key], ref_h[key], rtol=1e-6)


def test_the_compiled_function_holds_the_gradients_and_not_the_update(hvd):
    model = mlp()
    train(model, DistributedOptimizer(keras.optimizers.Adam(0.01)), [BroadcastGlobalVariablesCallback(0)], epochs=1)
    x, y = data()
    compiled = xla.compiled_function(model)
    hlo = compiled.experimental_get_compiler_ir((tf.constant(x[:16]), tf.constant(y[:16])))(stage="hlo")
    assert "HloModule" in hlo
    before = [v.numpy() for v in model.trainable_variables]
    logs, grads = compiled((tf.constant(x[:16]), tf.constant(y[:16])))
    assert [tuple(g.shape) for g in grads] == [tuple(v.shape) for v in model.trainable_variables]
    assert max_diff([v.numpy() for v in model.trainable_variables], before) == 0.0  # nothing applied inside
    assert set(logs) >= {"loss", "mae"}


def test_evaluate_and_predict_stay_compiled(hvd):
    model = mlp()
    train(model, DistributedOptimizer(keras.optimizers.SGD(0.05)), [BroadcastGlobalVariablesCallback(0)], epochs=1)
    x, y = data()
    model.evaluate(x, y, verbose=0)
    model.predict(x, verbose=0)
    assert model.jit_compile is True  # Keras compiles its test and predict functions with XLA


class OwnStep(keras.Sequential):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_weights), self.trainable_weights))
        return {"loss": loss}


@pytest.mark.parametrize("make, reason", [
    (lambda: OwnStep([keras.Input((6,)), keras.layers.Dense(3)]), "it has its own train_step"),
    (lambda: keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), SyncBatchNormalization(name="sbn"),
                               keras.layers.Dense(3)]), "synchronized batch normalization (sbn)"),
])
def test_what_cannot_be_split_has_xla_turned_off_saying_why(hvd, caplog, monkeypatch, make, reason):
    monkeypatch.setattr(models, "_xla_warned", False)
    model = make()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse", jit_compile=True)
    model.train_function = object()
    with caplog.at_level(logging.WARNING, logger="hvdkeras"):
        assert models.prepare_xla(model) == "off"
    assert model.jit_compile is False and model.train_function is None and not xla.is_split(model)
    assert reason in caplog.text
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # trains, uncompiled


@pytest.mark.parametrize("distributed, jit, keep, expected", [
    (True, True, True, "kept"), (True, True, False, "off"), (True, False, True, ""), (False, True, True, "")])
def test_prepare_xla_acts_only_on_a_compiled_model_with_a_distributed_optimizer(hvd, distributed, jit, keep,
                                                                              expected):
    model = mlp()
    optimizer = keras.optimizers.SGD()
    model.compile(optimizer=DistributedOptimizer(optimizer) if distributed else optimizer, loss="mse",
                  jit_compile=jit)
    assert models.prepare_xla(model, keep=keep) == expected
    assert model.jit_compile is (jit and expected != "off")
    assert xla.is_split(model) is (expected == "kept")


def test_a_split_model_made_uncompiled_later_trains_uncompiled(hvd):
    model = mlp()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse", jit_compile=True)
    assert models.prepare_xla(model) == "kept"
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert xla.compiled_function(model) is not None
    model.jit_compile = False
    model.train_function = None
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert xla.compiled_function(model) is None
    assert model.optimizer.xla_update is False


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("mode, kept", [("keep", True), ("off", False)])
def test_the_wrap_keeps_xla_or_turns_it_off_as_told(hvd, mode, kept, explicit):
    """Also for a script that compiles with its own DistributedOptimizer (its optimizer is left as it is)."""
    wrap.install(wrap.Options(xla=mode))
    try:
        model = mlp()
        model.compile(optimizer=DistributedOptimizer(keras.optimizers.Adam()) if explicit else "adam", loss="mse",
                      jit_compile=True)
        assert isinstance(model.optimizer, DistributedOptimizer)
        assert model.jit_compile is kept and xla.is_split(model) is kept
        x, y = data()
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    finally:
        wrap.uninstall()


@pytest.mark.parametrize("wrapped", [None, "keep", "off"])
@pytest.mark.parametrize("variable", ["keep", "off"])
def test_the_wrap_and_the_callbacks_follow_one_xla_setting(hvd, monkeypatch, wrapped, variable):
    """The callbacks ready a model for XLA as the wrap does: by the wrap's option while it is installed (whatever
    HVDKERAS_XLA says), else by HVDKERAS_XLA; after the wrap is uninstalled, by HVDKERAS_XLA again."""
    monkeypatch.setenv("HVDKERAS_XLA", variable)
    if wrapped is not None:
        wrap.install(wrap.Options(xla=wrapped))
    try:
        assert models.xla_setting() == (wrapped or variable)
        model = mlp()
        model.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse", jit_compile=True)
        BroadcastGlobalVariablesCallback(0).set_model(model)
        kept = (wrapped or variable) == "keep"
        assert model.jit_compile is kept and xla.is_split(model) is kept
    finally:
        if wrapped is not None:
            wrap.uninstall()
    assert models.xla_setting() == variable


def test_a_bad_xla_mode_is_refused(hvd):
    with pytest.raises(ValueError, match="xla"):
        wrap.Options(xla="on")
