"""strategy.run loops in one process, the seam faked as two identical workers (every allreduce sees the same
value on both): the workers become more replicas of the script's strategy under the global batch."""

import warnings

import keras
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.training import loops, strategy_loops


@pytest.fixture
def fake(hvd, monkeypatch):
    """Size 2, rank 0; allreduce and the gradients' grouped allreduce as two workers holding the same values,
    their ops recorded."""
    calls = {"allreduce": [], "grads": []}

    def allreduce(tensor, op=C.Average, name=None, **kwargs):
        calls["allreduce"].append(op)
        return tensor * 2 if op == C.Sum else tf.identity(tensor)

    def grouped_allreduce(tensors, op=C.Average, **kwargs):
        calls["grads"].append(op)
        return [t * 2 if op == C.Sum else tf.identity(t) for t in tensors]

    monkeypatch.setattr(C, "size", lambda: 2)
    monkeypatch.setattr(C, "allreduce", allreduce)
    monkeypatch.setattr(C, "grouped_allreduce", grouped_allreduce)
    monkeypatch.setattr(loops.collectives, "broadcast_variables", lambda *a, **k: None)

    def install(batch="global"):
        loops.install(batch=batch)
        return calls

    yield install
    loops.uninstall()


def _rows(distributed):
    return [int(tf.shape(tf.nest.flatten(batch)[0])[0]) for batch in distributed]


DATA = tf.data.Dataset.range(12).map(lambda i: tf.cast(i, tf.float32))


def test_experimental_distribute_dataset_gives_each_worker_its_rows_of_every_global_batch(fake):
    fake()
    strategy = tf.distribute.get_strategy()
    assert _rows(strategy.experimental_distribute_dataset(DATA.batch(4))) == [2, 2, 2]
    assert strategy.num_replicas_in_sync == 1  # the script's global batch stays one process's


def test_under_per_worker_batches_each_worker_takes_whole_batches(fake):
    fake("per-worker")
    assert _rows(tf.distribute.get_strategy().experimental_distribute_dataset(DATA.batch(2))) == [2, 2, 2]


def test_a_dataset_the_script_shards_itself_is_left_whole(fake):
    fake()
    dataset = DATA.shard(2, 0).batch(2)
    assert _rows(tf.distribute.get_strategy().experimental_distribute_dataset(dataset)) == [2, 2, 2]


@pytest.mark.parametrize("batch, replicas", [("global", 2), ("per-worker", 1)])
def test_the_input_context_counts_every_workers_pipelines(fake, batch, replicas):
    fake(batch)
    seen = []

    def dataset_fn(context):
        seen.append((context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync))
        return DATA.shard(context.num_input_pipelines, context.input_pipeline_id).batch(2)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(tf.distribute.get_strategy().distribute_datasets_from_function(dataset_fn))
    assert seen == [(2, 0, replicas)]


def test_a_dataset_function_that_does_not_shard_is_said_once(fake):
    fake()
    strategy_loops._state["warned"].discard("not-sharded")
    strategy = tf.distribute.get_strategy()
    with pytest.warns(UserWarning, match="does not shard its data"):
        strategy.distribute_datasets_from_function(lambda context: DATA.batch(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strategy.distribute_datasets_from_function(lambda context: DATA.batch(2))


def _split(fake, batch="global"):
    calls = fake(batch)
    list(tf.distribute.get_strategy().experimental_distribute_dataset(DATA.batch(4)))  # the data is split
    return calls


@pytest.mark.parametrize("traced", [False, True])
def test_in_strategy_run_the_gradients_are_summed_and_the_losses_scaled_by_every_worker(fake, traced):
    calls = _split(fake)
    strategy = tf.distribute.get_strategy()
    model, opt = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]), keras.optimizers.SGD(0.1)
    x = tf.ones((4, 1))

    def replica():
        with tf.GradientTape() as tape:
            per_example = tf.reduce_sum(model(x) ** 2, axis=1)
            average = tf.nn.compute_average_loss(per_example)
            keras_loss = keras.losses.MeanSquaredError()(tf.zeros((4, 1)), model(x))
            regularization = tf.nn.scale_regularization_loss(tf.constant(1.0))
        opt.apply_gradients(zip(tape.gradient(average, model.trainable_variables), model.trainable_variables))
        return tf.reduce_sum(per_example), average, keras_loss, regularization

    step = tf.function(lambda: strategy.run(replica)) if traced else (lambda: strategy.run(replica))
    total, average, keras_loss, regularization = (float(v) for v in step())
    assert C.Sum in calls["grads"] and C.Average not in calls["grads"]
    assert average == pytest.approx(total / 8)  # 4 rows here and 4 on the other worker
    assert keras_loss == pytest.approx(total / 4 / 2)  # the Keras loss's mean, over 2 replicas in all
    assert regularization == pytest.approx(0.5)


def test_outside_strategy_run_or_under_per_worker_nothing_is_summed(fake):
    calls = _split(fake, "per-worker")
    strategy = tf.distribute.get_strategy()
    model, opt = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]), keras.optimizers.SGD(0.1)

    def replica():
        average = tf.nn.compute_average_loss(tf.ones((4,)))  # this worker's 4 rows: per-worker
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model.trainable_variables[0])
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return average

    assert float(strategy.run(replica)) == 1.0
    assert calls["grads"] == [C.Average] and C.Sum not in calls["allreduce"]
    assert float(tf.nn.compute_average_loss(tf.ones((4,)))) == 1.0


def test_strategy_reduce_reduces_across_the_workers(fake):
    calls = _split(fake)
    strategy = tf.distribute.get_strategy()
    per_row = strategy.run(lambda: tf.constant([1.0, 2.0, 3.0]))
    assert float(strategy.reduce("SUM", tf.constant(3.0), axis=None)) == 6.0
    assert float(strategy.reduce(tf.distribute.ReduceOp.MEAN, tf.constant(3.0), axis=None)) == 3.0
    assert float(strategy.reduce("MEAN", per_row, axis=0)) == pytest.approx(2.0)  # both workers' rows
    assert float(strategy.reduce("SUM", per_row, axis=0)) == 12.0
    assert calls["allreduce"] == [C.Sum, C.Average, C.Sum, C.Sum]


def test_a_local_mean_loss_in_strategy_run_is_said_once(fake):
    _split(fake)
    strategy_loops._state["warned"].discard("local-mean")
    strategy = tf.distribute.get_strategy()
    model, opt = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]), keras.optimizers.SGD(0.1)

    def replica():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(tf.ones((4, 1))) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    with pytest.warns(UserWarning, match="none of tf.distribute's scalings"):
        strategy.run(replica)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strategy.run(replica)
