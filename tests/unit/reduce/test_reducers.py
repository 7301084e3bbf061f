"""hvdkeras.reduce: the reducer interface under DistributedOptimizer and the tape, the built-ins, and how one is
chosen (`reducer=`, `shard_optimizer_state=True`), against the faked seam. The real 2-worker runs of both
built-ins: tests/multiworker/test_optimizer_2w.py and test_sharding_2w.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras.reduce import AllreduceReducer, Reduced, Reducer, ReduceScatterReducer, make_reducer
from hvdkeras.reduce.allreduce import reduce_gradients
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.training.optimizer import DistributedOptimizer
from hvdkeras.training.tape import DistributedGradientTape

from ..helpers import small_model


class Recording(Reducer):
    """Keeps the last variable out of every update (its gradient is dropped) and records each call."""

    def __init__(self):
        self.calls = []

    def build(self, variables):
        self.calls.append(("build", len(variables)))

    def updated(self, variables):
        return list(variables)[:-1]

    def reduce(self, grads, variables, name="hvdkeras.gradients"):
        self.calls.append(("reduce", len(grads), name))
        return Reduced([g * 2.0 for g in grads][:-1], list(variables)[:-1], pending="mine")

    def after_apply(self, reduced):
        self.calls.append(("after_apply", reduced.pending, len(reduced.variables)))


def test_apply_is_reduce_then_the_update_of_what_it_returned_then_after_apply(hvd):
    model = small_model()
    variables = model.trainable_variables
    before = [v.numpy().copy() for v in variables]
    reducer = Recording()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.5), reducer=reducer)
    assert opt.reducer is reducer
    opt.apply([tf.ones_like(v) for v in variables], variables)
    assert reducer.calls == [("build", len(variables)), ("reduce", len(variables), "hvdkeras.gradients"),
                             ("after_apply", "mine", len(variables) - 1)]
    for v, b in zip(variables[:-1], before[:-1]):  # the reduced gradient (2x), at the inner optimizer's rate
        np.testing.assert_allclose(v.numpy(), b - 0.5 * 2.0, rtol=1e-6)
    np.testing.assert_array_equal(variables[-1].numpy(), before[-1])  # not among the updated variables


def test_accumulated_passes_are_reduced_once_per_update(hvd):
    model = small_model()
    variables = model.trainable_variables
    reducer = Recording()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), reducer=reducer, backward_passes_per_step=3)
    for _ in range(6):
        opt.apply([tf.ones_like(v) for v in variables], variables)
    assert [c[0] for c in reducer.calls].count("reduce") == 2
    assert [c[0] for c in reducer.calls].count("after_apply") == 2


def test_the_built_in_reducers_and_how_they_are_named(hvd):
    assert type(make_reducer(ReductionOptions())) is AllreduceReducer
    assert type(make_reducer(ReductionOptions(shard_optimizer_state=True))) is ReduceScatterReducer
    assert type(DistributedOptimizer(keras.optimizers.SGD()).reducer) is AllreduceReducer
    for opt in (DistributedOptimizer(keras.optimizers.SGD(), reducer="reduce_scatter"),
                DistributedOptimizer(keras.optimizers.SGD(), shard_optimizer_state=True)):
        assert type(opt.reducer) is ReduceScatterReducer and opt.shard_optimizer_state
        assert opt.get_config()["shard_optimizer_state"] is True  # saved as the shorthand, which loads back
    assert not DistributedOptimizer(keras.optimizers.SGD(), reducer="allreduce").shard_optimizer_state


@pytest.mark.parametrize("reducer, shard, error, match", [
    ("ring", False, TypeError, "`reducer` must be one of 'allreduce', 'reduce_scatter' or an hvdkeras.reduce.Reducer. "
                               "Received: reducer='ring'"),
    (AllreduceReducer, False, TypeError, "Received: reducer=<class"),
    ("allreduce", True, ValueError, "Received: reducer='allreduce', shard_optimizer_state=True"),
    (Recording(), True, ValueError, "Pass `reducer` or `shard_optimizer_state=True`"),
])
def test_a_reducer_that_is_not_one_is_refused_naming_it(hvd, reducer, shard, error, match):
    with pytest.raises(error, match=match):
        DistributedOptimizer(keras.optimizers.SGD(), reducer=reducer, shard_optimizer_state=shard)


def test_the_allreduce_reducer_is_reduce_gradients_over_every_variable(fake_seam):
    fake_seam.second_worker()
    model = small_model()
    variables = model.trainable_variables
    grads = [tf.ones_like(v) for v in variables]
    reducer = AllreduceReducer(ReductionOptions(bucket_bytes=0))
    reducer.build(variables)
    reduced = reducer.reduce(grads, variables)
    assert reduced.variables == list(variables) and reducer.updated(variables) == list(variables)
    expected = reduce_gradients(grads, variables, ReductionOptions(bucket_bytes=0))
    for got, want in zip(reduced.grads, expected):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        np.testing.assert_array_equal(got.numpy(), 2 * np.ones(got.shape))  # the fake's second worker: 3x ours
    assert reducer.state() == [] and reducer.shard is None


def test_the_reduce_scatter_reducer_updates_only_what_this_worker_owns(fake_seam):
    calls = []

    def alltoall(tensor, name=None, process_set=None):
        calls.append(name)
        return tensor

    fake_seam.set(size=2, rank=1, alltoall=alltoall,
                  allgather=lambda tensor, name=None, process_set=None: tf.concat([tensor, tensor], axis=0))
    model = small_model()
    variables = model.trainable_variables
    reducer = ReduceScatterReducer(ReductionOptions(bucket_bytes=0), rank_and_size=lambda: (1, 2))
    reducer.build(variables)
    mine = reducer.updated(variables)
    assert mine and len(mine) < len(variables) and all(reducer.shard.owns(v) for v in mine)
    reduced = reducer.reduce([tf.ones_like(v) for v in variables], variables)
    assert [id(v) for v in reduced.variables] == [id(v) for v in mine] and calls
    assert all(g is not None for g in reduced.grads)
    reducer.after_apply(reduced)  # the all-gather: every variable assigned from the gathered buffers


def test_the_reduce_scatter_reducer_on_one_worker_reduces_everything(hvd):
    model = small_model()
    variables = model.trainable_variables
    reducer = ReduceScatterReducer(ReductionOptions())
    reducer.build(variables)
    reduced = reducer.reduce([tf.ones_like(v) for v in variables], variables)
    assert reduced.variables == list(variables) and reduced.pending is None


def test_the_tape_reduces_through_the_allreduce_reducer(hvd, monkeypatch):
    seen = []
    reduce = AllreduceReducer.reduce

    def recorded(self, grads, variables, name="hvdkeras.gradients"):
        seen.append(name)
        return reduce(self, grads, variables, name=name)

    monkeypatch.setattr(AllreduceReducer, "reduce", recorded)
    v = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * v)
    grad = DistributedGradientTape(tape).gradient(loss, v)
    np.testing.assert_array_equal(grad.numpy(), [2.0, 4.0])
    assert len(seen) == 1 and seen[0].startswith("hvdkeras.tape")


class Counting(AllreduceReducer):
    """An allreduce that counts its reductions in a variable of its own: state saved with the optimizer."""

    def build(self, variables):
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="reductions")

    def reduce(self, grads, variables, name="hvdkeras.gradients"):
        self.steps.assign_add(1)
        return super().reduce(grads, variables, name=name)

    def state(self):
        return [self.steps]


def test_a_reducers_state_is_saved_after_the_inner_optimizers_and_loads_back(hvd, tmp_path):
    model = small_model()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                 reducer=Counting(ReductionOptions())), loss="mse")
    x, y = np.ones((8, 3), "float32"), np.ones((8, 2), "float32")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    opt = model.optimizer
    assert int(opt.reducer.steps.numpy()) == 2 and opt.variables[-1] is opt.reducer.steps
    path = tmp_path / "weights.weights.h5"
    model.save_weights(path)
    inner_count = len(opt.inner_optimizer.variables)
    # A fresh copy, trained one step so that everything is built, then loaded: the count and Adam's state return.
    again = small_model()
    again.compile(optimizer=DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                 reducer=Counting(ReductionOptions())), loss="mse")
    again.fit(x[:4], y[:4], batch_size=4, epochs=1, verbose=0)
    again.load_weights(path)
    assert int(again.optimizer.reducer.steps.numpy()) == 2
    for mine, theirs in zip(opt.inner_optimizer.variables, again.optimizer.inner_optimizer.variables[:inner_count]):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    # The built-in reducers have no state: their files are what a plain Keras optimizer saves.
    assert AllreduceReducer(ReductionOptions()).state() == [] and ReduceScatterReducer(ReductionOptions()).state() == []


@pytest.mark.parametrize("kwargs, match", [
    ({"period": 0}, "`period` must be an integer >= 1. Received: period=0"),
    ({"period": 2.5}, "Received: period=2.5"),
    ({"period": 2, "warmup_steps": -1}, "Received: warmup_steps=-1"),
])
def test_local_sgd_refuses_a_period_or_warmup_out_of_range(kwargs, match):
    from hvdkeras.reduce import LocalSGDReducer

    with pytest.raises(ValueError, match=match):
        LocalSGDReducer(**kwargs)


def test_local_sgd_on_one_worker_steps_alone_and_counts_its_updates(hvd):
    from hvdkeras.reduce import LocalSGDReducer

    reducer = LocalSGDReducer(period=2, warmup_steps=1)
    assert repr(reducer) == "LocalSGDReducer(period=2, warmup_steps=1)" and reducer.state() == []
    model = small_model()
    variables = model.trainable_variables
    before = [v.numpy().copy() for v in variables]
    opt = DistributedOptimizer(keras.optimizers.SGD(0.5), reducer=reducer)
    for _ in range(3):
        opt.apply([tf.ones_like(v) for v in variables], variables)
    assert int(reducer.steps.numpy()) == 3 and reducer.state() == [reducer.steps]
    for v, b in zip(variables, before):  # one worker: its average is itself
        np.testing.assert_allclose(v.numpy(), b - 3 * 0.5, rtol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"period": 0}, "Received: period=0"),
    ({"period": 2, "outer_learning_rate": 0}, "Received: outer_learning_rate=0"),
    ({"period": 2, "outer_momentum": 1.0}, r"`outer_momentum` must be in \[0, 1\). Received: outer_momentum=1.0"),
    ({"period": 2, "outer_momentum": -0.1}, "Received: outer_momentum=-0.1"),
])
def test_diloco_refuses_arguments_out_of_range(kwargs, match):
    from hvdkeras.reduce import DiLoCoReducer

    with pytest.raises(ValueError, match=match):
        DiLoCoReducer(**kwargs)


def test_diloco_on_one_worker_takes_the_outer_nesterov_step_from_its_anchor(hvd):
    from hvdkeras.reduce import DiLoCoReducer

    var = tf.Variable([1.0, 2.0])
    reducer = DiLoCoReducer(period=2, outer_learning_rate=0.5, outer_momentum=0.9)
    opt = DistributedOptimizer(keras.optimizers.SGD(1.0), reducer=reducer)
    for _ in range(2):
        opt.apply([tf.constant([1.0, 1.0])], [var])
    # Anchor [1, 2]; after 2 inner steps [-1, 0]: delta 2; m = -0.5 * 2 = -1; anchor += 0.9 * -1 - 1 = -1.9.
    np.testing.assert_allclose(var.numpy(), [1.0 - 1.9, 2.0 - 1.9], rtol=1e-6)
    np.testing.assert_allclose(reducer.momenta[0].numpy(), [-1.0, -1.0], rtol=1e-6)
    assert len(reducer.state()) == 3 and int(reducer.steps.numpy()) == 2


def test_autograph_converts_every_reducer_method_a_traced_step_calls(hvd, caplog):
    # A method whose body is a docstring alone cannot be converted: AutoGraph then warns on every trace of a
    # user's tf.function step.
    import logging

    from hvdkeras.reduce import DiLoCoReducer, LocalSGDReducer, PowerSGDReducer

    for reducer in (None, PowerSGDReducer(start_step=0), LocalSGDReducer(2), DiLoCoReducer(2)):
        model = small_model()
        opt = DistributedOptimizer(keras.optimizers.SGD(0.1), reducer=reducer)

        @tf.function
        def step(x, model=model, opt=opt):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x))
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

        with caplog.at_level(logging.WARNING, logger="tensorflow"):
            step(tf.ones((2, model.inputs[0].shape[-1])))
    assert not [r for r in caplog.records if "AutoGraph could not transform" in r.getMessage()]
