"""tf.distribute in one process: the strategy check, the MultiWorkerMirroredStrategy stand-in, and hvdkeras's
learning-rate handling of the distributed variables a strategy's scope makes."""

import subprocess
import sys
import textwrap

import keras
import pytest
import tensorflow as tf

import hvdkeras
from hvdkeras.training import strategy


class FakeStrategy:
    """What check_strategy reads of a strategy: its replicas and their devices."""

    num_replicas_in_sync = 2

    class extended:
        worker_devices = ("/gpu:0", "/gpu:1")


def test_one_replica_per_process_passes_and_several_are_refused_by_name():
    strategy.check_strategy()  # the default strategy
    strategy.check_strategy(tf.distribute.MirroredStrategy())  # over this process's one CPU
    strategy.check_strategy(tf.distribute.OneDeviceStrategy("/cpu:0"))
    with pytest.raises(ValueError, match=r"FakeStrategy with 2 replicas in one process.*'/gpu:0', '/gpu:1'"):
        strategy.check_strategy(FakeStrategy())


def test_distributed_optimizer_refuses_a_strategy_with_two_replicas_in_one_process(tmp_path):
    """Two logical CPUs make a real MirroredStrategy with two replicas (in a fresh process: TensorFlow's devices
    are fixed once it starts)."""
    script = textwrap.dedent("""
        import keras, tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import hvdkeras
        with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
            try:
                hvdkeras.DistributedOptimizer(keras.optimizers.SGD(0.1))
            except ValueError as err:
                print("REFUSED:", err)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "REFUSED: hvdkeras runs one process per device" in out.stdout, out.stderr[-3000:]
    assert "MirroredStrategy with 2 replicas" in out.stdout


def test_multi_worker_mirrored_strategy_is_stood_in_for_with_one_warning(hvd, caplog):
    original = tf.distribute.MultiWorkerMirroredStrategy
    assert strategy.install()
    try:
        strategy._warned.clear()
        with caplog.at_level("WARNING", logger="hvdkeras"):
            first = tf.distribute.MultiWorkerMirroredStrategy()
            second = tf.distribute.experimental.MultiWorkerMirroredStrategy(communication_options=None)
        assert isinstance(first, tf.distribute.MirroredStrategy) and first.num_replicas_in_sync == 1
        assert isinstance(second, tf.distribute.MultiWorkerMirroredStrategy)
        assert [r.getMessage() for r in caplog.records if "stands in" in r.getMessage()] != []
        assert len([r for r in caplog.records if "MultiWorkerMirroredStrategy" in r.getMessage()]) == 1
    finally:
        strategy.uninstall()
    assert tf.distribute.MultiWorkerMirroredStrategy is original


def test_learning_rates_of_a_strategy_scope_are_read_scaled_and_set(hvd, monkeypatch, fake_seam):
    from hvdkeras.training.learning_rate import as_float, check_learning_rate

    fake_seam.set(size=2)
    with tf.distribute.MirroredStrategy().scope():
        optimizer = keras.optimizers.Adam(0.001)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=hvdkeras.DistributedOptimizer(optimizer), loss="mse")
    variable = optimizer._learning_rate
    assert type(variable.value).__name__ == "MirroredVariable"
    with pytest.raises(TypeError):
        float(variable)  # what failed in the wrap before
    assert as_float(variable) == pytest.approx(0.001) and check_learning_rate("lr", variable) == pytest.approx(0.001)
    callback = hvdkeras.callbacks.LearningRateWarmupCallback(0.002, warmup_epochs=1, steps_per_epoch=2)
    callback.set_model(model)
    callback.on_epoch_begin(0)
    callback.on_train_batch_begin(1)
    assert as_float(model.optimizer.learning_rate) == pytest.approx(0.0015)


@pytest.mark.parametrize("bad", ["0.1", [0.1, 0.2], True, None])
def test_as_float_refuses_what_is_not_one_number(bad):
    from hvdkeras.training.learning_rate import as_float

    with pytest.raises(TypeError, match="Received"):
        as_float(bad)
