"""The "loops" patch in one process, the seam faked as two workers: every Keras optimizer's update reduces its
gradients once, at the outermost optimizer, and broadcasts before its first update; XLA is refused."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import collectives
from hvdkeras.training import loops


@pytest.fixture
def two_workers(hvd, monkeypatch):
    """Size 2 as far as the loops patch can tell; the reductions and broadcasts counted (values unchanged)."""
    calls = {"reduce": [], "broadcast": 0}
    grouped = C.grouped_allreduce

    def grouped_allreduce(tensors, *args, **kwargs):
        calls["reduce"].append(kwargs.get("name"))
        return grouped(tensors, *args, **kwargs)

    def broadcast_variables(variables, root_rank=0, **kwargs):
        def count():
            calls["broadcast"] += 1
            return 0

        if tf.inside_function():  # counted when the traced step runs it, not when it is traced
            tf.py_function(count, [], tf.int32)
        else:
            count()

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


@pytest.fixture
def split_as_rank1(hvd, monkeypatch):
    """The loops patch as `hvdkeras run` installs it (--batch global), this process playing rank 1 of 2."""
    monkeypatch.setattr(C, "size", lambda: 2)
    monkeypatch.setattr(C, "rank", lambda: 1)
    loops.install(batch="global")
    yield
    loops.uninstall()


def _first_column(batches):
    return [np.asarray(b)[:, 0].tolist() for b in batches]


def test_the_scripts_own_iteration_of_a_batched_dataset_is_split(split_as_rank1):
    ds = tf.data.Dataset.from_tensor_slices(np.arange(12, dtype="float32").reshape(6, 2)).batch(4)
    assert _first_column(ds) == [[4.0, 6.0], [10.0]]  # rank 1: the second half of each batch (4 rows, then 2)
    assert _first_column(iter(ds)) == [[4.0, 6.0], [10.0]]
    assert _first_column(ds.as_numpy_iterator()) == [[0.0, 2.0, 4.0, 6.0], [8.0, 10.0]]  # a library's: whole


def test_unbatched_or_self_sharded_datasets_stay_whole(split_as_rank1):
    rows = np.arange(8, dtype="float32").reshape(4, 2)
    assert len(list(tf.data.Dataset.from_tensor_slices(rows))) == 4  # elements, not batches
    sharded = tf.data.Dataset.from_tensor_slices(rows).shard(2, 1).batch(2)  # the script sharded it itself
    assert _first_column(sharded) == [[2.0, 6.0]]
    assert loops._state["split_any"] is False


def test_a_script_that_calls_init_itself_keeps_its_loops_data(split_as_rank1, hvd):
    # The explicit API (Horovod's TF2 pattern: hvd.init(), a DistributedGradientTape): each worker's batch is
    # the script's, as under horovodrun, and no warning says the data is not split.
    hvd.init()
    ds = tf.data.Dataset.from_tensor_slices(np.arange(12, dtype="float32").reshape(6, 2)).batch(4)
    assert _first_column(ds) == [[0.0, 2.0, 4.0, 6.0], [8.0, 10.0]]
    assert _first_column(tf.distribute.get_strategy().experimental_distribute_dataset(ds)) == _first_column(ds)
    model, opt = _model(), keras.optimizers.SGD(0.1)
    warned = loops._state["warned"]
    warned.discard("not-split")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.apply_gradients(zip(_grads(model), model.trainable_variables))
    assert "not-split" not in warned


def test_per_worker_deals_whole_batches_and_leaves_an_endless_stream_whole(hvd, monkeypatch, fake_seam):
    fake_seam.set(size=2)
    fake_seam.set(rank=1)
    loops.install(batch="per-worker")
    try:
        ds = tf.data.Dataset.from_tensor_slices(np.arange(8, dtype="float32").reshape(4, 2)).batch(1)
        assert _first_column(ds) == [[2.0], [6.0]]  # batches 1 and 3: every second whole batch
        endless = ds.repeat()
        assert [b.shape[0] for b, _ in zip(endless, range(3))] == [1, 1, 1]
        assert _first_column(b for b, _ in zip(endless, range(2))) == [[0.0], [2.0]]  # all of it, in order
    finally:
        loops.uninstall()


def test_no_split_under_no_shard(hvd, monkeypatch):
    monkeypatch.setattr(C, "size", lambda: 2)
    loops.install(batch=None)
    try:
        ds = tf.data.Dataset.from_tensor_slices(np.zeros((4, 2), "float32")).batch(4)
        assert [b.shape[0] for b in ds] == [4]
    finally:
        loops.uninstall()
    with pytest.raises(ValueError, match="Received: batch='local'"):
        loops.install(batch="local")


def test_keras_metric_results_are_global_once_the_data_is_split(split_as_rank1, monkeypatch):
    summed = []

    def global_result(metrics, local_result, name):
        summed.append(name)
        return local_result()

    monkeypatch.setattr(loops.metric_states, "global_result", global_result)
    metric = keras.metrics.Mean()
    metric.update_state([1.0, 3.0])
    metric.result()
    assert summed == []  # nothing split yet: the states are already every worker's
    for _ in tf.data.Dataset.from_tensor_slices(np.zeros((4, 1), "float32")).batch(2):
        pass
    float(metric.result())
    assert summed == ["hvdkeras.loop_metrics"]

    class Custom(keras.metrics.Metric):  # defined after the patch: its result is global too
        def update_state(self, value):
            pass

        def result(self):
            return tf.constant(1.0)

    Custom().result()
    assert summed == ["hvdkeras.loop_metrics"] * 2


@pytest.fixture
def split_counted(split_as_rank1, monkeypatch):
    """split_as_rank1, with the names of the gradients' reductions counted (values unchanged: one process)."""
    names = []
    grouped = C.grouped_allreduce

    def grouped_allreduce(tensors, *args, **kwargs):
        names.append(kwargs.get("name"))
        return grouped(tensors, *args, **kwargs)

    monkeypatch.setattr(C, "grouped_allreduce", grouped_allreduce)
    monkeypatch.setattr(loops.rank_zero, "is_rank_zero", lambda: True)
    yield names


def _split_something():
    for _ in tf.data.Dataset.from_tensor_slices(np.zeros((4, 1), "float32")).batch(2):
        pass


@pytest.mark.parametrize("traced", [False, True])
def test_clipping_in_the_loop_averages_the_gradients_first_and_the_optimizer_not_again(split_counted, traced):
    model, opt = _model(), keras.optimizers.SGD(0.1)
    model(X)  # built, and broadcast at the first update

    def step(per_tensor):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(X) ** 2) * 100.0
        grads = tape.gradient(loss, model.trainable_variables)
        if per_tensor:
            clipped, norm = [tf.clip_by_norm(g, 1.0) for g in grads], tf.constant(2.0)
        else:
            clipped, norm = tf.clip_by_global_norm(grads, 1.0)
        opt.apply_gradients(zip(clipped, model.trainable_variables))
        return clipped, norm

    run = tf.function(step) if traced else step
    run(False)  # nothing split yet: each worker's gradient is one process's, left to the optimizer
    assert split_counted == ["hvdkeras.loop.0.0"]
    split_counted.clear()
    _split_something()
    run = tf.function(step) if traced else step
    clipped, norm = run(False)
    # the gradients averaged at the clip, before it (in one bucket: ".0"); the optimizer gets the clipped ones,
    # marked reduced
    assert split_counted == ["hvdkeras.loop_clip.0" + (".0" if traced else "") + ".0"]
    assert float(norm) > 1.0
    np.testing.assert_allclose(float(tf.linalg.global_norm(clipped)), 1.0, rtol=1e-5)
    split_counted.clear()
    run(True)
    # one reduction per tf.clip_by_norm, named apart in one traced step (they may run at the same time)
    assert split_counted == (["hvdkeras.loop_clip.1.0.0", "hvdkeras.loop_clip.1.1.0"] if traced
                             else ["hvdkeras.loop_clip.1.0"] * 2)


def test_clipping_what_is_no_gradient_or_by_the_scripts_own_norm_reduces_nothing(split_counted):
    _split_something()
    activations = [tf.constant([3.0, 4.0])]
    clipped, norm = tf.clip_by_global_norm(activations, 1.0)  # a forward pass's tensors: not gradients
    np.testing.assert_allclose(clipped[0], [0.6, 0.8])
    np.testing.assert_allclose(tf.clip_by_norm(activations[0], 1.0), [0.6, 0.8])
    assert split_counted == []
    model = _model()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(X) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for _ in range(2):
            tf.clip_by_global_norm(grads, 1.0, use_norm=tf.linalg.global_norm(grads))
    messages = [str(w.message) for w in said if "clips its gradients by a norm" in str(w.message)]
    assert len(messages) == 1 and "use_norm" in messages[0]
    assert split_counted == []


def test_a_model_built_inside_the_traced_step_is_broadcast_inside_it_once(split_as_rank1):
    # A Sequential without an Input builds its variables in the step's first trace, where their values exist
    # only once the trace is done: the broadcast runs inside the step, the first time it runs.
    model = keras.Sequential([keras.layers.Conv2D(2, 3), keras.layers.Flatten(), keras.layers.Dense(1)])
    opt = keras.optimizers.SGD(0.01)
    images = tf.ones((2, 5, 5, 1))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(images) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    first = float(step())
    assert [bool(flag) for flag in opt._hvdkeras_pending.values()] == [False]
    assert float(step()) < first
    assert len(opt._hvdkeras_pending) == 1 and int(opt.iterations) == 2
