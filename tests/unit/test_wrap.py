"""The Keras patches of `python -m hvdkeras`, in one process (the world size faked where it matters)."""

import inspect
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras
from hvdkeras import wrap
from hvdkeras.training.optimizer import DistributedOptimizer
from hvdkeras.wrap import fit_callbacks, methods, state


@pytest.fixture
def installed(hvd):
    wrap.install(wrap.Options())
    yield
    wrap.uninstall()


@pytest.fixture
def per_worker(hvd):
    """`--batch per-worker`: whole batches on every worker, the rate scaled (linear) and warmed up."""
    wrap.install(wrap.Options(batch="per-worker"))
    yield
    wrap.uninstall()


def model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


@pytest.mark.parametrize("optimizer", ["adam", keras.optimizers.Adam(0.001), {"class_name": "Adam",
                                                                               "config": {"learning_rate": 0.001}}])
def test_compile_wraps_and_scales(per_worker, monkeypatch, optimizer, fake_seam):
    fake_seam.set(size=4)
    m = model()
    m.compile(optimizer=optimizer, loss="mse", jit_compile=True)
    assert isinstance(m.optimizer, DistributedOptimizer)
    assert float(m.optimizer.learning_rate) == pytest.approx(0.004)
    assert m.jit_compile is True  # kept for the forward and backward pass (tests/unit/test_xla.py)


def test_compile_under_mixed_precision_puts_loss_scaling_inside(installed):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        m = model()
        m.compile(optimizer="sgd", loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(m.optimizer, DistributedOptimizer)
    # compile kept it (no LossScaleOptimizer around it): the loss is scaled once, inside, after the reduction.
    assert isinstance(m.optimizer.inner_optimizer, keras.optimizers.LossScaleOptimizer)
    assert not isinstance(m.optimizer.inner_optimizer.inner_optimizer, keras.optimizers.LossScaleOptimizer)


def test_save_writes_on_rank_zero_only(installed, monkeypatch, tmp_path, fake_seam):
    m = model()
    m.compile(optimizer="sgd", loss="mse")
    fake_seam.set(rank=1)
    m.save(tmp_path / "a.keras")
    m.save_weights(tmp_path / "a.weights.h5")
    assert list(tmp_path.iterdir()) == []
    fake_seam.set(rank=0)
    m.save(tmp_path / "a.keras")
    m.save_weights(tmp_path / "a.weights.h5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.keras", "a.weights.h5"]


def test_fit_shards_arrays_and_validation_split(per_worker, monkeypatch, fake_seam):
    fake_seam.set(size=2)
    fake_seam.set(rank=1)
    seen = {}

    def fake_fit(self, **kwargs):
        seen.update(kwargs)

    fake_fit.__signature__ = inspect.signature(keras.Model.fit.__wrapped__)  # the original, under the patch

    m = model()
    m.compile(optimizer="sgd", loss="mse")
    x, y = np.arange(30, dtype="float32").reshape(10, 3), np.zeros((10, 2), "float32")
    methods.fit(fake_fit, m, x, y, validation_split=0.2, verbose=1, callbacks=[keras.callbacks.CSVLogger("x.csv")])
    assert seen["x"][:, 0].tolist() == [3.0, 9.0, 15.0, 21.0]  # rows 1, 3, 5, 7 of the first 8
    assert seen["validation_data"][0][:, 0].tolist() == [27.0]  # row 9: the last 20%, rank 1's half
    assert seen["validation_split"] == 0.0
    assert seen["verbose"] == 0
    kinds = [type(cb).__name__ for cb in seen["callbacks"]]
    assert kinds[:4] == ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "MovingStatistics", "Warmup"]
    assert isinstance(seen["callbacks"][3], hvdkeras.callbacks.LearningRateWarmupCallback)
    assert "RankZeroOnly" in kinds


def test_uninstall_restores_keras(hvd):
    original = keras.Model.fit
    wrap.install(wrap.Options())
    assert keras.Model.fit is not original
    wrap.uninstall()
    assert keras.Model.fit is original


def test_a_script_compiling_with_a_distributed_optimizer_is_left_alone(installed, monkeypatch, tmp_path, fake_seam):
    """Explicit-API scripts shard and gate their own writes: no second sharding, no barrier in save."""
    fake_seam.set(size=2)
    m = model()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
    m.compile(optimizer=opt, loss="mse")
    assert m.optimizer is opt and float(opt.learning_rate) == pytest.approx(0.1)  # not scaled again
    seen = {}
    monkeypatch.setattr(methods, "sharded_fit_inputs",
                        lambda kwargs, batch: seen.setdefault("sharded", True) and kwargs)
    m.fit(np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), epochs=1, verbose=0)
    assert "sharded" not in seen
    fake_seam.set(rank=1)
    m.save(tmp_path / "rank1.keras")  # the script asked for it on this rank: it is written, nothing waits
    assert (tmp_path / "rank1.keras").exists()


def test_load_model_compiles_with_the_scripts_loss_and_keeps_the_saved_rate(per_worker, monkeypatch, tmp_path,
                                                                            fake_seam):
    """keras.models.load_model in a job: Keras's compile_from_config compiles the model (the patch is on the
    class that defines compile, so Keras does not take it for an override), with the saved loss and metrics,
    and the saved rate is not scaled a second time."""
    fake_seam.set(size=2)
    m = model()
    m.compile(optimizer=keras.optimizers.Adam(0.001), loss="mse", metrics=["mae"])
    m.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer, DistributedOptimizer)
    assert loaded.loss == "mse" and loaded.compiled
    assert float(loaded.optimizer.learning_rate) == pytest.approx(0.002)
    assert loaded._hvdkeras_warmup_lr is None
    result = loaded.evaluate(np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"), return_dict=True, verbose=0)
    assert set(result) == {"loss", "mae"}


class TwoOptimizers(keras.Model):
    """A GAN's shape: its own compile keeps two optimizers besides Keras's."""

    def __init__(self):
        super().__init__()
        self.a = keras.layers.Dense(2)
        self.b = keras.layers.Dense(2)

    def compile(self, a_optimizer, b_optimizer):
        super().compile()
        self.a_optimizer = a_optimizer
        self.b_optimizer = b_optimizer


def test_fit_distributes_the_optimizers_a_model_holds(per_worker, monkeypatch, fake_seam):
    fake_seam.set(size=2)
    m = TwoOptimizers()
    m.compile(keras.optimizers.Adam(0.001), keras.optimizers.SGD(0.01))

    def fake_fit(self, **kwargs):
        pass

    fake_fit.__signature__ = inspect.signature(keras.Model.fit.__wrapped__)
    methods.fit(fake_fit, m, np.ones((4, 3), "float32"))
    assert isinstance(m.a_optimizer, DistributedOptimizer) and isinstance(m.b_optimizer, DistributedOptimizer)
    assert float(m.a_optimizer.learning_rate) == pytest.approx(0.002)
    assert float(m.b_optimizer.learning_rate) == pytest.approx(0.02)
    assert list(hvdkeras.training.models.held_optimizers(m)) == ["optimizer", "a_optimizer", "b_optimizer"]


def test_predict_prints_progress_on_rank_zero_only(installed, monkeypatch, fake_seam):
    seen = {}

    def fake_predict(self, **kwargs):
        seen.update(kwargs)

    fake_predict.__signature__ = inspect.signature(keras.Model.predict.__wrapped__)
    m = model()
    x = np.ones((10, 3), "float32")
    fake_seam.set(rank=1)
    methods.predict(fake_predict, m, x, verbose=1)
    assert seen["verbose"] == 0 and seen["x"] is x  # every worker predicts all of its input
    fake_seam.set(rank=0)
    methods.predict(fake_predict, m, x, verbose=1)
    assert seen["verbose"] == 1


def _warmup_in_fit(m):
    warmup = fit_callbacks.Warmup(0.02, warmup_epochs=1)
    warmup.set_model(m)
    warmup.set_params({"steps": 4, "epochs": 2})
    m._hvdkeras_warmup_lr = 0.02
    warmup.on_train_begin()
    warmup.on_epoch_begin(0)
    return warmup


def test_warmup_warms_up_while_the_script_leaves_the_rate_alone(hvd, monkeypatch, fake_seam):
    fake_seam.set(size=2)
    m = model()
    m.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.02)), loss="mse")
    warmup = _warmup_in_fit(m)
    rates = []
    for batch in range(4):
        warmup.on_train_batch_begin(batch)
        rates.append(float(m.optimizer.learning_rate))
    warmup.on_epoch_end(0, {})
    assert rates == pytest.approx([0.01, 0.0125, 0.015, 0.0175])
    assert float(m.optimizer.learning_rate) == pytest.approx(0.02)
    assert not warmup.handed_over and m._hvdkeras_warmup_lr is None  # warmed up once: not again in a later fit


@pytest.mark.parametrize("when", ["before the first batch", "after warm-up"])
def test_warmup_hands_the_rate_over_when_the_script_sets_it(hvd, monkeypatch, when, fake_seam):
    """The rule: once the script sets the rate (its own callback, LearningRateScheduler, ...), hvdkeras stops
    warming up and the rate stays what the script set."""
    fake_seam.set(size=2)
    m = model()
    m.compile(optimizer=DistributedOptimizer(keras.optimizers.SGD(0.02)), loss="mse")
    warmup = _warmup_in_fit(m)
    if when == "after warm-up":
        for batch in range(4):
            warmup.on_train_batch_begin(batch)
        warmup.on_epoch_end(0, {})
        warmup.on_epoch_begin(1)
    m.optimizer.learning_rate = 0.005  # what a LearningRateScheduler does in on_epoch_begin
    with pytest.warns(UserWarning, match="sets the learning rate itself"):
        state.STATE.warned.discard("lr-script")
        warmup.on_train_batch_begin(0)
    for batch in range(1, 4):
        warmup.on_train_batch_begin(batch)
    warmup.on_epoch_end(1, {})
    assert warmup.handed_over and float(m.optimizer.learning_rate) == pytest.approx(0.005)
    assert m._hvdkeras_warmup_lr is None


# ------------------------------------------------------------------------------------- --batch global
def _captured_fit(m, *args, **kwargs):
    seen = {}

    def fake_fit(self, **kw):
        seen.update(kw)

    fake_fit.__signature__ = inspect.signature(keras.Model.fit.__wrapped__)
    methods.fit(fake_fit, m, *args, **kwargs)
    return seen


def test_global_batch_leaves_the_rate_and_adds_no_warmup(installed, monkeypatch, fake_seam):
    fake_seam.set(size=4)
    m = model()
    m.compile(optimizer=keras.optimizers.Adam(0.001), loss="mse")
    assert float(m.optimizer.learning_rate) == pytest.approx(0.001)
    seen = _captured_fit(m, np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), epochs=1)
    kinds = [type(cb).__name__ for cb in seen["callbacks"]]
    assert "Warmup" not in kinds and kinds[:2] == ["BroadcastGlobalVariablesCallback", "MetricAverageCallback"]


def test_an_explicit_lr_scaling_applies_under_the_global_batch_too(hvd, monkeypatch, fake_seam):
    fake_seam.set(size=4)
    wrap.install(wrap.Options(lr_scaling="sqrt"))
    try:
        m = model()
        m.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    finally:
        wrap.uninstall()
    assert float(m.optimizer.learning_rate) == pytest.approx(0.02)


def _rows(dataset):
    # Read through TensorFlow's own iterator: the wrap would split a dataset this test file iterates itself, as
    # it splits a script's loop.
    batches = dataset.as_numpy_iterator() if hasattr(dataset, "as_numpy_iterator") else dataset
    return [np.asarray(batch[0])[:, 0].tolist() for batch in batches]


@pytest.mark.parametrize("rank", [0, 1])
def test_global_batch_arrays_become_keras_own_batches_split(installed, monkeypatch, rank, fake_seam):
    """Arrays become the batches Keras makes of them in one process (here unshuffled), and each worker takes its
    rows of every batch: 20 rows, batch_size 8 -> batches of 8, 8 and 4, rank r takes 4, 4 and 2 of them."""
    fake_seam.set(size=2)
    fake_seam.set(rank=rank)
    m = model()
    m.compile(optimizer="sgd", loss="mse")
    x = np.arange(60, dtype="float32").reshape(20, 3)
    seen = _captured_fit(m, x, np.zeros((20, 2), "float32"), batch_size=8, shuffle=False,
                         validation_data=(x[:4], np.zeros((4, 2), "float32")))
    assert seen["y"] is None and seen["batch_size"] is None and seen["validation_batch_size"] == 8
    assert int(seen["x"].cardinality()) == 3
    firsts = [list(range(0, 8)), list(range(8, 16)), list(range(16, 20))]
    expected = [[3.0 * i for i in rows[rank * len(rows) // 2:(rank + 1) * len(rows) // 2]] for rows in firsts]
    assert _rows(seen["x"]) == expected
    assert np.asarray(seen["validation_data"][0])[:, 0].tolist() == ([0.0, 6.0] if rank == 0 else [3.0, 9.0])


def test_global_batch_keeps_class_weights_as_sample_weights(installed, monkeypatch, fake_seam):
    fake_seam.set(size=2)
    m = model()
    m.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((4, 3), "float32"), np.array([0, 1, 1, 0], "int64")
    seen = _captured_fit(m, x, y, batch_size=4, shuffle=False, class_weight={0: 1.0, 1: 5.0})
    (batch,) = list(seen["x"])
    assert seen["class_weight"] is None and np.asarray(batch[2]).tolist() == [1.0, 5.0]


def test_global_batch_splits_datasets_py_datasets_and_generators(installed, monkeypatch, fake_seam):
    import tensorflow as tf

    fake_seam.set(size=2)
    fake_seam.set(rank=1)
    m = model()
    m.compile(optimizer="sgd", loss="mse")
    x = np.arange(30, dtype="float32").reshape(10, 3)
    y = np.zeros((10, 2), "float32")
    seen = _captured_fit(m, tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
    assert _rows(seen["x"]) == [[6.0, 9.0], [18.0, 21.0], [27.0]]  # 4, 4, 2 rows: the second half of each

    def batches():
        for start in (0, 4):
            yield x[start:start + 4], y[start:start + 4]

    seen = _captured_fit(m, batches())
    assert _rows(seen["x"]) == [[6.0, 9.0], [18.0, 21.0]]


def test_unmodified_scripts_take_the_batch_convention_from_the_environment():
    assert wrap.options_from_env({"HVDKERAS_BATCH": "per-worker"}) == {"batch": "per-worker"}
    with pytest.raises(ValueError, match="Received: batch='local'"):
        wrap.Options(batch="local")
    assert wrap.Options().scaling_rule == "none" and wrap.Options(batch="per-worker").scaling_rule == "linear"


def test_per_worker_batch_leaves_an_infinite_dataset_whole_with_a_warning(per_worker, monkeypatch, fake_seam):
    import tensorflow as tf

    fake_seam.set(size=2)
    m = model()
    m.compile(optimizer="sgd", loss="mse")
    endless = tf.data.Dataset.from_tensors((np.ones((4, 3), "float32"), np.ones((4, 2), "float32"))).repeat()
    state.STATE.warned.clear()
    with pytest.warns(UserWarning, match="cannot be sharded: every worker reads all of it"):
        seen = _captured_fit(m, endless, steps_per_epoch=2)
    assert seen["x"] is endless


def test_global_batch_arrays_shuffled_differently_get_one_shared_shuffle(installed, monkeypatch, fake_seam):
    """Workers whose first batches differ (unseeded, or seeded by rank) get the rows shuffled with rank 0's seed:
    both ranks then cut the same global batches, which together cover every row once per epoch, each epoch
    in another order."""
    fake_seam.set(size=2)
    fake_seam.set(allgather_object=lambda obj, name=None: [obj, "another worker's first batch"])
    fake_seam.set(broadcast_object=lambda obj, root_rank=0, name=None: 1234)
    state.STATE.warned.clear()
    x = np.arange(40, dtype="float32").reshape(20, 2)
    y = np.zeros((20, 1), "float32")
    epochs = {}
    for rank in (0, 1):
        fake_seam.set(rank=rank)
        m = model()
        m.compile(optimizer="sgd", loss="mse")
        state.STATE.warned.discard("shuffle-seed")
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            seen = _captured_fit(m, x, y, batch_size=8)
        warned = [str(w.message) for w in said if "shuffles them with one seed on every worker" in str(w.message)]
        assert len(warned) == (1 if rank == 0 else 0)  # rank 0 says it
        assert int(seen["x"].cardinality()) == 3
        epochs[rank] = [_rows(seen["x"]) for _ in range(2)]
    for epoch in range(2):
        both = [a + b for a, b in zip(epochs[0][epoch], epochs[1][epoch])]
        assert [len(rows) for rows in both] == [8, 8, 4]
        assert sorted(v for rows in both for v in rows) == [2.0 * i for i in range(20)]
    assert epochs[0][0] != epochs[0][1]  # shuffled anew each epoch


def test_wrapped_fit_rejects_bad_steps_and_warns_on_unbatched_data(hvd):
    wrap.install(wrap.Options(no_shard=True))
    try:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3), "float32"), np.zeros(8, "float32")))
        with pytest.warns(UserWarning, match="one dimension less than the model's inputs"):
            try:
                model.fit(ds, epochs=1, verbose=0)
            except Exception as error:  # Keras's own verdict on the input, not hvdkeras's
                assert "one dimension less" not in str(error)
        with pytest.raises(ValueError, match="Received: steps_per_epoch=5"):
            model.fit(ds.batch(4), steps_per_epoch=5, epochs=1, verbose=0)
    finally:
        wrap.uninstall()


def test_wrapped_fit_takes_arrays_one_axis_short_as_keras_does(hvd):
    # Keras's siamese example: Input((4, 1)) fed arrays of shape (N, 4); a functional model adds the axis.
    x, y = np.random.default_rng(0).normal(size=(16, 4)).astype("float32"), np.zeros((16, 1), "float32")
    inputs = keras.Input((4, 1))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(inputs)))
    model.compile(optimizer="sgd", loss="mse")
    wrap.install(wrap.Options())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    finally:
        wrap.uninstall()
    assert len(history.history["loss"]) == 1
