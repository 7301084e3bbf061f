"""hvdkeras.reduce.sharded_state in one process: the full state's layout for Keras's optimizers, re-sharding, and the
errors (the partition and the reduce-scatter: tests/unit/reduce/test_reduce_scatter.py). The 2-worker behaviour:
tests/multiworker/test_sharding_2w.py."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.reduce import sharded_state as sharding
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.reduce.shard import Shard
from hvdkeras.training.optimizer import DistributedOptimizer, PartialDistributedOptimizer


def stack(widths=(4, 8, 16, 2), seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((widths[0],))] + [keras.layers.Dense(w) for w in widths[1:]])


# ---------------------------------------------------------------------------------------------- the state
def slots_per_variable(optimizer_factory, model):
    opt = optimizer_factory()
    opt.build(model.trainable_variables)
    return opt


@pytest.mark.parametrize("factory", [
    lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    lambda: keras.optimizers.Adam(amsgrad=True),  # slot-major: every velocity_hat after the interleaved pairs
    lambda: keras.optimizers.AdamW(use_ema=True),
    lambda: keras.optimizers.Adafactor(),  # factored moments made with add_variable, named after the variable
    lambda: keras.optimizers.RMSprop(momentum=0.5, centered=True),
    lambda: keras.optimizers.Lamb(),
    lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()),
])
def test_full_layout_finds_every_variable_of_an_unsharded_build(factory):
    model = stack()
    built = slots_per_variable(factory, model)
    layout = sharding.full_layout(factory(), model.trainable_variables)
    assert len(layout) == len(built.variables)
    for entry, variable in zip(layout, built.variables):
        found = (sharding._resolve(built, entry.address) if entry.variable is None
                 else sharding._resolve(built, entry.address, entry.variable))
        assert found is variable


def test_full_layout_allocates_no_slots():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(512)])
    layout = sharding.full_layout(keras.optimizers.Adam(), model.trainable_variables)
    assert len(layout) == 2 + 2 * 2  # iterations, learning rate, then a momentum and a velocity per variable


class DictSlots(keras.optimizers.Optimizer):
    """Keeps its slots in a dict: no worker can be said to own them."""

    def build(self, var_list):
        super().build(var_list)
        self.slots = {v.path: self.add_variable_from_reference(v, "m") for v in var_list}

    def update_step(self, gradient, variable, learning_rate):
        variable.assign_sub(gradient * learning_rate)


def test_an_optimizer_whose_slots_cannot_be_placed_is_refused_naming_it():
    model = stack()
    with pytest.raises(ValueError, match=r"cannot shard DictSlots: it keeps the variable .*_m"):
        sharding.full_layout(DictSlots(0.1), model.trainable_variables)


@pytest.mark.parametrize("cut", [False, True])
def test_reshard_keeps_the_owned_part_of_a_full_state(cut):
    model = stack((4, 8, 16, 2))
    variables = model.trainable_variables
    full = keras.optimizers.Adam(0.1)
    full.apply([tf.fill(v.shape, 0.5) * (1.0 + np.arange(int(v.shape[0])).reshape([-1] + [1] * (len(v.shape) - 1)))
                for v in variables], variables)
    shard = Shard.make(variables, ReductionOptions(bucket_bytes=0), frozenset(), 1, 2,
                       splittable=sharding.splittable(full) if cut else None)
    assert any(shard.split(i) for i in range(len(variables))) is cut
    part = sharding.reshard(full, shard)
    assert int(part.iterations.numpy()) == 1
    owned = shard.owned_indices()
    assert len(part.variables) == 2 + 2 * len(owned)
    for k, i in enumerate(owned):
        p = shard.piece(i)
        np.testing.assert_array_equal(part._momentums[k].numpy(), full._momentums[i].numpy()[p.lo:p.hi])
        np.testing.assert_array_equal(part._velocities[k].numpy(), full._velocities[i].numpy()[p.lo:p.hi])


@pytest.mark.parametrize("factory, cut", [
    (lambda: keras.optimizers.Adam(), True),
    (lambda: keras.optimizers.SGD(momentum=0.9), True),
    (lambda: keras.optimizers.Nadam(), True),
    (lambda: keras.optimizers.Lion(), True),
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()), True),
    (lambda: keras.optimizers.Adafactor(), False),  # factored second moments: per whole variable
    (lambda: keras.optimizers.Lamb(), False),  # a trust ratio of whole-variable norms
    (lambda: keras.optimizers.Adam(clipnorm=1.0), False),  # a per-variable norm
])
def test_only_elementwise_updates_are_cut_into_pieces(factory, cut):
    model = stack()
    rule = sharding.splittable(factory())
    assert [rule(v) for v in model.trainable_variables] == [cut] * len(model.trainable_variables)


def test_a_variable_excluded_from_weight_decay_is_owned_whole():
    model = stack()
    opt = keras.optimizers.AdamW(weight_decay=0.1)
    opt.exclude_from_weight_decay(var_names=["bias"])
    rule = sharding.splittable(opt)
    assert [rule(v) for v in model.trainable_variables] == ["kernel" in v.path for v in model.trainable_variables]


def test_assign_state_takes_the_owned_entries_of_a_full_state():
    model = stack()
    variables = model.trainable_variables
    full = keras.optimizers.SGD(0.1, momentum=0.9)
    full.build(variables)
    layout = sharding.full_layout(full, variables)
    values = [np.full(v.shape, float(j)) for j, v in enumerate(full.variables)]
    shard = Shard.make(variables, ReductionOptions(bucket_bytes=0), frozenset(), 0, 2)
    part = keras.optimizers.SGD(0.1, momentum=0.9)
    part.build(shard.owned())
    sharding.assign_state(part, layout, shard, values)
    for entry, value in zip(layout, values):
        if entry.variable is not None and shard.owns(variables[entry.variable]):
            k = [id(v) for v in shard.owned()].index(id(variables[entry.variable]))
            np.testing.assert_array_equal(part.momentums[k].numpy(), value)


# ------------------------------------------------------------------------------------------ the optimizer
def test_shard_optimizer_state_is_keyword_only_after_horovods_parameters():
    params = inspect.signature(DistributedOptimizer).parameters
    assert params["shard_optimizer_state"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["shard_optimizer_state"].default is False
    assert list(params)[-2:] == ["shard_optimizer_state", "reducer"]  # keyword-only, after Horovod's
    assert params["reducer"].kind is inspect.Parameter.KEYWORD_ONLY and params["reducer"].default is None
    with pytest.raises(TypeError):
        DistributedOptimizer(keras.optimizers.SGD(), None, "", "", None, False, 1.0, C.Average, 1, False, 0, None,
                             C.global_process_set, True, None, True)
    assert "shard_optimizer_state" in inspect.signature(PartialDistributedOptimizer).parameters


def test_sharding_is_recorded_in_the_config(hvd):
    opt = DistributedOptimizer(keras.optimizers.Adam(), shard_optimizer_state=True)
    assert opt.shard_optimizer_state is True
    config = opt.get_config()
    assert config["shard_optimizer_state"] is True
    assert DistributedOptimizer.from_config(config).shard_optimizer_state is True


def test_sharding_over_a_process_set_is_refused(hvd):
    with pytest.raises(ValueError, match="global process set only. Received: process_set="):
        ReductionOptions(process_set=C.ProcessSet([0]), shard_optimizer_state=True)


def test_one_sharded_worker_trains_as_the_unsharded_optimizer(hvd):
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x[:, :2] * 2.0
    weights = {}
    for shard in (False, True):
        model = stack()
        opt = DistributedOptimizer(keras.optimizers.Adam(0.01, global_clipnorm=1.0), shard_optimizer_state=shard)
        model.compile(optimizer=opt, loss="mse")
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        weights[shard] = [v.numpy() for v in model.trainable_variables]
        assert opt.sharded is shard
    for a, b in zip(weights[False], weights[True]):
        np.testing.assert_array_equal(a, b)


def test_the_sharding_state_is_the_reducers_and_not_the_optimizers(hvd):
    """DistributedOptimizer holds no sharding state of its own: who owns what is its reducer's `shard`, and the
    layout, gathered and loaded state are the reducer's optimizer_state (a ShardedState)."""
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    model = stack()
    opt = DistributedOptimizer(keras.optimizers.Adam(0.01), shard_optimizer_state=True)
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, x[:, :2], batch_size=8, epochs=1, verbose=0)
    opt.consolidate_state()
    assert isinstance(opt.reducer.optimizer_state, sharding.ShardedState) and opt.reducer.shard is not None
    assert opt.reducer.optimizer_state._gathered is not None
    words = ("shard", "layout", "gathered_state", "loaded_state")
    held = [name for name in vars(opt) if any(word in name for word in words)]
    assert held == [], held
    assert not any(isinstance(value, Shard) for value in vars(opt).values())


def test_global_clipnorm_with_local_variables_is_refused(hvd):
    model = stack()
    opt = PartialDistributedOptimizer(keras.optimizers.Adam(global_clipnorm=1.0), local_layers=[model.layers[-1]],
                                      shard_optimizer_state=True)
    with pytest.raises(ValueError, match="cannot combine `global_clipnorm` with local variables"):
        opt.build(model.trainable_variables)


def test_sharded_state_saves_like_the_plain_optimizer(hvd, tmp_path):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    model = stack()
    model.compile(optimizer=DistributedOptimizer(keras.optimizers.Adam(0.01), shard_optimizer_state=True), loss="mse")
    model.fit(x, x[:, :2], batch_size=8, epochs=1, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert type(loaded.optimizer) is keras.optimizers.Adam
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
