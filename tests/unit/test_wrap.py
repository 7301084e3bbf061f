"""The Keras patches of `python -m hvdkeras`, in one process (the world size faked where it matters)."""

import inspect

import keras
import numpy as np
import pytest

from hvdkeras import _collectives as C
from hvdkeras import wrap
from hvdkeras.optimizer import DistributedOptimizer


@pytest.fixture
def installed(hvd):
    wrap.install(wrap.Options())
    yield
    wrap.uninstall()


def model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


@pytest.mark.parametrize("optimizer", ["adam", keras.optimizers.Adam(0.001), {"class_name": "Adam",
                                                                               "config": {"learning_rate": 0.001}}])
def test_compile_wraps_and_scales(installed, monkeypatch, optimizer):
    monkeypatch.setattr(C, "size", lambda: 4)
    m = model()
    m.compile(optimizer=optimizer, loss="mse", jit_compile=True)
    assert isinstance(m.optimizer, DistributedOptimizer)
    assert float(m.optimizer.learning_rate) == pytest.approx(0.004)
    assert m.jit_compile is False


def test_compile_under_mixed_precision_puts_loss_scaling_inside(installed):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        m = model()
        m.compile(optimizer="sgd", loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(m.optimizer, DistributedOptimizer)
    assert isinstance(m.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(m.optimizer.inner_optimizer, keras.optimizers.LossScaleOptimizer)


def test_save_writes_on_rank_zero_only(installed, monkeypatch, tmp_path):
    m = model()
    m.compile(optimizer="sgd", loss="mse")
    monkeypatch.setattr(C, "rank", lambda: 1)
    m.save(tmp_path / "a.keras")
    m.save_weights(tmp_path / "a.weights.h5")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(C, "rank", lambda: 0)
    m.save(tmp_path / "a.keras")
    m.save_weights(tmp_path / "a.weights.h5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.keras", "a.weights.h5"]


def test_fit_shards_arrays_and_validation_split(installed, monkeypatch):
    monkeypatch.setattr(C, "size", lambda: 2)
    monkeypatch.setattr(C, "rank", lambda: 1)
    seen = {}

    def fake_fit(self, **kwargs):
        seen.update(kwargs)

    fake_fit.__signature__ = inspect.signature(keras.Model.fit.__wrapped__)  # the original, under the patch

    m = model()
    m.compile(optimizer="sgd", loss="mse")
    x, y = np.arange(30, dtype="float32").reshape(10, 3), np.zeros((10, 2), "float32")
    wrap._fit(fake_fit, m, x, y, validation_split=0.2, verbose=1, callbacks=[keras.callbacks.CSVLogger("x.csv")])
    assert seen["x"][:, 0].tolist() == [3.0, 9.0, 15.0, 21.0]  # rows 1, 3, 5, 7 of the first 8
    assert seen["validation_data"][0][:, 0].tolist() == [27.0]  # row 9: the last 20%, rank 1's half
    assert seen["validation_split"] == 0.0
    assert seen["verbose"] == 0
    kinds = [type(cb).__name__ for cb in seen["callbacks"]]
    assert kinds[:3] == ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback"]
    assert "RankZeroOnly" in kinds


def test_uninstall_restores_keras(hvd):
    original = keras.Model.fit
    wrap.install(wrap.Options())
    assert keras.Model.fit is not original
    wrap.uninstall()
    assert keras.Model.fit is original


def test_a_script_compiling_with_a_distributed_optimizer_is_left_alone(installed, monkeypatch, tmp_path):
    """Explicit-API scripts shard and gate their own writes: no second sharding, no barrier in save."""
    monkeypatch.setattr(C, "size", lambda: 2)
    m = model()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
    m.compile(optimizer=opt, loss="mse")
    assert m.optimizer is opt and float(opt.learning_rate) == pytest.approx(0.1)  # not scaled again
    seen = {}
    monkeypatch.setattr(wrap, "_sharded_fit_inputs", lambda kwargs: seen.setdefault("sharded", True) and kwargs)
    m.fit(np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), epochs=1, verbose=0)
    assert "sharded" not in seen
    monkeypatch.setattr(C, "rank", lambda: 1)
    m.save(tmp_path / "rank1.keras")  # the script asked for it on this rank: it is written, nothing waits
    assert (tmp_path / "rank1.keras").exists()
