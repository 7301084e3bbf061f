"""The network benchmark's device-like compute: waits that take time but no core, with the model's gradients.

Which waits ran, and for how long each, is read from time.sleep's calls (a sleeping thread takes no core),
not timed."""

import time

import numpy as np
import pytest
import tensorflow as tf

from . import load

dc = load("device_compute")


@pytest.fixture
def sleeps(monkeypatch):
    """The seconds of every time.sleep call while the test runs (each still sleeps)."""
    calls, sleep = [], time.sleep
    monkeypatch.setattr(dc.time, "sleep", lambda seconds: (calls.append(seconds), sleep(seconds))[1])
    return calls


def test_a_timed_wait_sleeps_its_time(sleeps):
    fn = tf.function(lambda x: dc.timed_wait(x, 0.2))
    fn(tf.zeros((4, 3)))
    sleeps.clear()
    out = fn(tf.ones((4, 3)))
    assert out.shape == (4, 3) and float(tf.reduce_sum(out)) == 12.0
    assert sleeps == [0.2]


def test_the_stand_in_has_the_models_weights_and_its_times(sleeps):
    import keras

    tf.random.set_seed(0)
    real = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3)])
    times = dc.calibrate(real, np.ones((4, 6), "float32"), reps=3)
    assert [t["shapes"] for t in times] == [[[6, 5], [5]], [[5, 3], [3]]]
    assert all(t["forward_s"] >= 0 and t["backward_s"] >= 0 for t in times)
    times = [dict(t, forward_s=0.05, backward_s=0.1) for t in times]
    model = dc.device_model(keras, times, 3)
    assert [tuple(v.shape) for v in model.trainable_variables] == [(6, 5), (5,), (5, 3), (3,)]
    assert dc.totals(times) == {"forward_s": pytest.approx(0.1), "backward_s": pytest.approx(0.2)}
    # The batch is an argument and the loss's gradient depends on the outputs, as in training: on constants
    # grappler would run the stateless waits once, while optimizing the graph.
    step = tf.function(lambda x: tf.gradients(tf.reduce_sum(model(x) ** 2), model.trainable_variables))
    step(tf.zeros((4, 3)))
    sleeps.clear()
    grads = step(tf.ones((4, 3)))
    assert [tuple(g.shape) for g in grads] == [(6, 5), (5,), (5, 3), (3,)]
    # Each layer's forward wait, then each one's backward wait, once per step: none folded away or repeated.
    assert sleeps == [0.05, 0.05, 0.1, 0.1]
