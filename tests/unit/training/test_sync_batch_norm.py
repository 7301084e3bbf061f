"""hvdkeras.training.sync_batch_norm: the moments of the global batch, Keras's own layer synchronized by the patch,
and the moving statistics' average, against the faked seam (a second worker whose batch is known)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import patches
from hvdkeras.training import sync_batch_norm

RNG = np.random.default_rng(0)
OURS = RNG.normal(size=(6, 3)).astype("float32")
THEIRS = RNG.normal(2.0, 3.0, size=(4, 3)).astype("float32")  # the second worker's batch: another size too


def with_second_worker(fake_seam, theirs=THEIRS, mask=None):
    """The seam's allreduce(Sum) adds what the second worker's batch contributes: [sum, sum of squares, count]."""
    names = []
    weights = np.ones_like(theirs) if mask is None else mask
    contribution = np.stack([(theirs * weights).sum(0), (theirs ** 2 * weights).sum(0), weights.sum(0)])

    def allreduce(t, op=C.Average, name=None, **kwargs):  # noqa: ARG001
        assert op == C.Sum
        names.append(name)
        return t + tf.constant(contribution, t.dtype)

    fake_seam.set(size=2, is_initialized=lambda: True, allreduce=allreduce)
    return names


def test_synchronized_moments_are_those_of_the_global_batch(fake_seam):
    names = with_second_worker(fake_seam)
    mean, variance = sync_batch_norm.synchronized_moments(tf.constant(OURS), [0], "bn")
    both = np.concatenate([OURS, THEIRS])
    np.testing.assert_allclose(mean, both.mean(0), rtol=1e-5)
    np.testing.assert_allclose(variance, both.var(0), rtol=1e-4)
    assert names == ["bn"]


def test_masked_rows_do_not_count(fake_seam):
    with_second_worker(fake_seam)
    mask = np.array([1, 1, 1, 0, 0, 0], "float32")
    mean, _ = sync_batch_norm.synchronized_moments(tf.constant(OURS), [0], "bn", mask=tf.constant(mask))
    np.testing.assert_allclose(mean, np.concatenate([OURS[:3], THEIRS]).mean(0), rtol=1e-5)


def test_float16_inputs_are_reduced_in_float32(fake_seam):
    with_second_worker(fake_seam)
    mean, variance = sync_batch_norm.synchronized_moments(tf.constant(OURS, tf.float16), [0], "bn")
    assert mean.dtype == tf.float32 and variance.dtype == tf.float32


def test_the_patch_synchronizes_keras_own_layer_only_when_asked(hvd, fake_seam):
    names = with_second_worker(fake_seam)
    sync_batch_norm.install()
    assert patches.installed("sync_batch_norm")
    synced = keras.layers.BatchNormalization(synchronized=True, name="synced")
    plain = keras.layers.BatchNormalization(name="plain")
    synced(OURS, training=True)
    plain(OURS, training=True)
    assert names == ["hvdkeras.sync_batch_norm.synced"]
    fake_seam.set(size=1)  # a job of one worker: Keras's own moments
    synced(OURS, training=True)
    assert names == ["hvdkeras.sync_batch_norm.synced"]


def test_sync_batch_normalization_synchronizes_without_the_patch(hvd, fake_seam):
    names = with_second_worker(fake_seam)
    patches.uninstall("sync_batch_norm")
    try:
        layer = sync_batch_norm.SyncBatchNormalization(momentum=0.0, name="sbn")
        layer(OURS, training=True)
        assert names == ["hvdkeras.sync_batch_norm.sbn"]
        both = np.concatenate([OURS, THEIRS])
        np.testing.assert_allclose(layer.moving_mean.numpy(), both.mean(0), rtol=1e-5)
    finally:
        sync_batch_norm.install()
    with pytest.raises(ValueError, match="Received: fused=True"):
        sync_batch_norm.SyncBatchNormalization(fused=True)


def test_moving_statistics_are_averaged_across_workers_except_synchronized_layers(hvd, fake_seam):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(name="bn"),
                              keras.layers.BatchNormalization(synchronized=True, name="synced")])
    model.get_layer("bn").moving_mean.assign([1.0, 2.0, 3.0])
    seen = []

    def grouped_allreduce(tensors, op=C.Average, name=None, **kwargs):  # noqa: ARG001
        seen.append((name, len(tensors)))
        return [t + 1.0 for t in tensors]  # the other worker holds ours + 2: the average is ours + 1

    fake_seam.set(size=2, is_initialized=lambda: True, grouped_allreduce=grouped_allreduce)
    sync_batch_norm.average_moving_statistics(model)
    assert seen == [("hvdkeras.moving_statistics", 2)]  # bn's mean and variance, not the synchronized layer's
    np.testing.assert_allclose(model.get_layer("bn").moving_mean.numpy(), [2.0, 3.0, 4.0])
    fake_seam.set(size=1)
    sync_batch_norm.average_moving_statistics(model)
    assert len(seen) == 1  # one worker: nothing to average
