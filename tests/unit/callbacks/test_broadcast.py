"""hvdkeras.callbacks.broadcast: what is broadcast (the model, every optimizer it holds, built first; not the local
variables) and when the workers' models are compared, against the faked seam."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import collectives
from hvdkeras.callbacks import broadcast
from hvdkeras.callbacks.broadcast import BroadcastGlobalVariablesCallback
from hvdkeras.variables import var_id

from ..helpers import small_model


def compiled(optimizer=None):
    model = small_model()
    model.compile(optimizer=optimizer or keras.optimizers.Adam(), loss="mse")
    return model


def test_the_model_and_every_held_optimizer_are_broadcast_built_except_local_variables(hvd, monkeypatch):
    model = compiled()
    model.d_optimizer = keras.optimizers.SGD(momentum=0.9)
    sent = []
    monkeypatch.setattr(collectives, "broadcast_variables",
                        lambda variables, root_rank, check: sent.append((list(variables), root_rank, check)))
    local = [model.layers[0].bias]
    broadcast.broadcast_model(model, root_rank=1, check=False, local_variables=local)
    (variables, root_rank, check), = sent
    assert (root_rank, check) == (1, False)
    assert model.optimizer.built and model.d_optimizer.built
    ids = [var_id(v) for v in variables]
    assert var_id(model.layers[0].kernel) in ids and var_id(local[0]) not in ids
    assert {var_id(v) for v in model.optimizer.variables} <= set(ids)
    assert {var_id(v) for v in model.d_optimizer.variables} <= set(ids)


def test_a_model_built_at_its_first_step_is_recognised():
    assert not broadcast.builds_at_first_step(small_model())
    assert broadcast.builds_at_first_step(keras.Sequential([keras.layers.Dense(2)]))

    class OwnStep(keras.Model):
        def train_step(self, data):
            return {}

    assert broadcast.builds_at_first_step(OwnStep())


def test_a_custom_train_step_is_traced_ahead_as_keras_traces_it_without_autograph():
    """create_step_variables traces a custom train_step as Keras's fit does (not converted by AutoGraph), and the
    trace creates the variables the step creates."""
    from tensorflow.python.autograph.core import ag_ctx

    seen = []

    class OwnStep(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            seen.append(ag_ctx.control_status_ctx().status)
            x, y = data
            with tf.GradientTape() as tape:
                loss = keras.ops.mean((self(x) - y) ** 2)
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            return {"loss": loss}

    x, y = np.ones((4, 3), "float32"), np.ones((4, 2), "float32")
    keras_model = OwnStep()
    keras_model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    keras_model.fit(x, y, epochs=1, verbose=0)
    under_keras = set(seen)
    seen.clear()
    model = OwnStep()
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    broadcast.create_step_variables(model, model.train_step, (tf.constant(x), tf.constant(y)))
    assert seen and set(seen) == under_keras and ag_ctx.Status.ENABLED not in under_keras
    assert model.built and model.optimizer.built
    assert len(model.optimizer.variables) == len(keras_model.optimizer.variables)


@pytest.mark.parametrize("given, variable, checks", [(None, None, True), (None, "0", False), (False, None, False),
                                                     (True, "0", True)])
def test_the_epoch_check_follows_the_argument_then_the_setting(hvd, monkeypatch, given, variable, checks):
    if variable is not None:
        monkeypatch.setenv("HVDKERAS_CHECK_MODELS", variable)
    calls = []
    monkeypatch.setattr(collectives, "check_in_sync", lambda variables, when, hint: calls.append((when, hint)))
    callback = BroadcastGlobalVariablesCallback(0, check_models=given)
    callback.set_model(compiled(keras.optimizers.SGD()))
    callback.on_epoch_end(2)
    assert bool(calls) is checks
    if checks:
        assert calls[0][0] == "after epoch 3"
        assert "keras.optimizers.SGD" in calls[0][1] or "not DistributedOptimizers" in calls[0][1]


def test_bad_root_rank():
    with pytest.raises(ValueError, match="Received: root_rank=-1"):
        BroadcastGlobalVariablesCallback(-1)


def test_broadcast_in_one_process_leaves_the_values(hvd):
    model = compiled()
    before = [np.array(w) for w in model.get_weights()]
    broadcast.broadcast_model(model)
    for b, w in zip(before, model.get_weights()):
        np.testing.assert_array_equal(b, w)
