"""Bad input and fault handling in one process: each error says what was received and what is expected."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import collectives, data, rank_zero, wrap
from hvdkeras.cli import command
from hvdkeras.cli import parse as cli
from hvdkeras.cli import supervise as supervision


def test_mismatch_message_names_the_first_differing_variable():
    rank0 = [("dense/kernel", (6, 8), "float32"), ("dense/bias", (8,), "float32")]
    rank1 = [("dense/kernel", (6, 9), "float32"), ("dense/bias", (9,), "float32")]
    message = collectives._mismatch_message([rank0, rank1])
    assert "variable #0" in message
    assert "rank 0 has 'dense/kernel' shape=(6, 8) dtype=float32" in message
    assert "rank 1 has 'dense/kernel' shape=(6, 9) dtype=float32" in message
    extra = rank0 + [("dense_1/kernel", (8, 3), "float32")]
    message = collectives._mismatch_message([rank0, extra])
    assert "variable #2: rank 0 has nothing, rank 1 has 'dense_1/kernel'" in message
    assert "rank 0 has 2 variables, rank 1 has 3" in message


def test_non_finite_learning_rate(hvd):
    with pytest.raises(ValueError, match="Received: learning_rate=nan"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(float("nan")))
    with pytest.raises(ValueError, match="Received: learning_rate=inf"):
        hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(float("inf"))))


def test_steps_per_epoch_larger_than_the_shard(hvd, monkeypatch):
    monkeypatch.setattr(C, "size", lambda: 2)
    shard = tf.data.Dataset.range(10).batch(2)  # 5 batches on this worker
    data.check_steps(shard, 5)
    with pytest.raises(ValueError, match=r"holds: 5 batches .*Received: steps_per_epoch=6"):
        data.check_steps(shard, 6)
    data.check_steps(shard.repeat(), 1000)  # repeated: nothing to check
    with pytest.raises(ValueError, match=r"holds: 2 batches .*Received: steps_per_epoch=3"):
        data.check_steps((np.zeros((40, 2)), np.zeros(40)), 3, batch_size=32)


def test_unbatched_dataset_is_rejected():
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3), "float32"), np.zeros(8)))
    with pytest.raises(ValueError, match="fit needs a batched dataset.*Received: a dataset with element_spec="):
        data.check_batched(ds, [2])
    data.check_batched(ds.batch(4), [2])


def test_wrapped_fit_rejects_bad_steps_and_unbatched_data(hvd):
    wrap.install(wrap.Options(no_shard=True))
    try:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3), "float32"), np.zeros(8, "float32")))
        with pytest.raises(ValueError, match="batched dataset"):
            model.fit(ds, epochs=1, verbose=0)
        with pytest.raises(ValueError, match="Received: steps_per_epoch=5"):
            model.fit(ds.batch(4), steps_per_epoch=5, epochs=1, verbose=0)
    finally:
        wrap.uninstall()


def test_checkpoint_callback_writes_through_a_temporary_name(hvd, tmp_path, monkeypatch):
    seen = []
    original = keras.Model.save

    def spy(self, filepath, *args, **kwargs):
        seen.append(str(filepath))
        return original(self, filepath, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", spy)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(np.zeros((4, 3)), np.zeros((4, 1)), epochs=1, verbose=0,
              callbacks=[hvd.callbacks.ModelCheckpoint(str(tmp_path / "c.keras"))])
    assert len(seen) == 1 and ".tmp" in seen[0] and seen[0] != str(tmp_path / "c.keras")
    assert [p.name for p in tmp_path.iterdir()] == ["c.keras"]


def test_on_rank_zero_releases_the_others_before_raising(monkeypatch):
    calls = []
    monkeypatch.setattr(rank_zero, "barrier", lambda: calls.append("barrier"))

    def boom():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        rank_zero.on_rank_zero(boom)
    assert calls == ["barrier"]


def test_stall_timeout_option():
    ns = cli.build_parser().parse_args(["run", "-np", "2", "--stall-timeout", "0", "t.py"])
    with pytest.raises(cli.UsageError, match="Received: --stall-timeout 0"):
        cli.validate(ns, isfile=lambda p: True, which=lambda n: "/bin/horovodrun", python="/x/python")
    ns = cli.build_parser().parse_args(["run", "-np", "2", "t.py"])
    cfg = cli.validate(ns, isfile=lambda p: True, which=lambda n: "/bin/horovodrun", python="/x/python")
    assert command.build_command(cfg)[1]["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "60"


def test_failure_tracker_takes_the_first_failed_rank():
    tracker = supervision.FailureTracker()
    for line in [b"Process 0 exit with status code 0.\n", b"Process 1 exit with status code -9.\n",
                 b"Process 0 exit with status code 1.\n"]:
        tracker.feed(line)
    assert tracker.first_failure() == (1, -9)


def test_failure_tracker_skips_ranks_that_only_failed_because_of_another():
    tracker = supervision.FailureTracker()
    for line in [b"[1]<stderr>:RuntimeError: injected failure on rank 1\n",
                 b"[0]<stderr>:Horovod has been shut down. This was caused by an exception on one of the ranks\n",
                 b"Process 0 exit with status code 1.\n", b"Process 1 exit with status code 1.\n"]:
        tracker.feed(line)
    assert tracker.first_failure() == (1, 1)
    only_collateral = supervision.FailureTracker()
    for line in [b"[0]<stderr>:Timed out waiting 30000ms for recv\n", b"Process 0 exit with status code 1.\n"]:
        only_collateral.feed(line)
    assert only_collateral.first_failure() == (0, 1)


def test_failure_tracker_names_a_rank_that_raised_and_was_terminated_before_it_exited():
    # What horovodrun printed when the survivor exited first and the rank that raised was then terminated.
    tracker = supervision.FailureTracker()
    for line in [b"[1]<stderr>:Traceback (most recent call last):\n",
                 b"[1]<stderr>:RuntimeError: injected failure on rank 1\n",
                 b"[0]<stderr>:Traceback (most recent call last):\n",
                 b"[0]<stderr>:Horovod has been shut down. This was caused by an exception on one of the ranks\n",
                 b"Process 0 exit with status code 1.\n",
                 b"Terminating remaining workers after failure of Process 0.\n",
                 b"[1]<stderr>:Terminated\n"]:
        tracker.feed(line)
    assert tracker.first_failure() == (1, None)
