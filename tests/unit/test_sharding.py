"""hvdkeras.sharding in one process: the partition, the reduce-scatter packing (against the faked seam), the full
state's layout for Keras's optimizers, re-sharding, and the errors. The 2-worker behaviour:
tests/multiworker/test_sharding_2w.py."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import sharding
from hvdkeras.optimizer import DistributedOptimizer, PartialDistributedOptimizer
from hvdkeras.reduction import ReductionOptions


def stack(widths=(4, 8, 16, 2), seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((widths[0],))] + [keras.layers.Dense(w) for w in widths[1:]])


# ---------------------------------------------------------------------------------------------- partition
def test_partition_balances_each_bucket_and_the_total():
    sizes = [100, 10, 100, 10, 50, 50, 7]
    owners = sharding.partition(sizes, [[0, 1, 2, 3], [4, 5, 6]], 2)
    assert owners[0] != owners[2] and owners[4] != owners[5]
    per = [sum(s for s, o in zip(sizes, owners) if o == r) for r in (0, 1)]
    assert abs(per[0] - per[1]) <= 10


def test_partition_is_deterministic_and_leaves_unbucketed_variables_to_every_worker():
    sizes = [5, 5, 5, 5]
    assert sharding.partition(sizes, [[0, 1, 2]], 2) == sharding.partition(sizes, [[0, 1, 2]], 2)
    assert sharding.partition(sizes, [[0, 1, 2]], 2)[3] == sharding.EVERY


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_shard_gives_every_variable_one_owner(n):
    model = stack((4, 8, 16, 8, 2))
    variables = model.trainable_variables
    shard = sharding.Shard.make(variables, ReductionOptions(bucket_bytes=0), frozenset(), 0, n)
    assert sorted(set(shard.owners)) == list(range(n))
    assert sum(shard.elements_by_worker()) == sum(int(np.prod(v.shape)) for v in variables)
    assert [shard.owns(v) for v in variables] == [o == 0 for o in shard.owners]


def test_more_workers_than_variables_is_a_clear_error():
    model = stack((3, 2))  # two variables
    with pytest.raises(ValueError, match=r"2 shared variables for 4 workers leave workers \[2, 3\]"):
        sharding.Shard.make(model.trainable_variables, ReductionOptions(bucket_bytes=0), frozenset(), 0, 4)


# ------------------------------------------------------------------------------------------ reduce-scatter
def recorded_alltoall(calls, size=2):
    """An alltoall whose other workers sent what this one did: this worker receives its own part `size` times."""

    def alltoall(tensor, name=None, process_set=None):
        calls.append((name, tensor.numpy().copy()))
        return tensor

    return alltoall


@pytest.mark.parametrize("rank", [0, 1])
def test_reduce_scatter_packs_each_bucket_by_owner_and_returns_only_owned_gradients(fake_seam, rank):
    calls = []
    fake_seam.set(size=2, rank=rank, alltoall=recorded_alltoall(calls))
    model = stack((4, 8, 16, 8))  # kernels 32, 128, 128 and biases 8, 16, 8
    variables = model.trainable_variables
    options = ReductionOptions(bucket_bytes=0, op=C.Sum)
    shard = sharding.Shard.make(variables, options, frozenset(), rank, 2)
    grads = [tf.fill(v.shape, float(i + 1)) for i, v in enumerate(variables)]
    out, unused = sharding.reduce_scatter_gradients(grads, variables, shard, options)
    assert unused == []  # this worker owns part of the one bucket
    assert len(calls) == 1
    name, buffer = calls[0]
    assert name == "hvdkeras.gradients.0"
    per_worker = shard.elements_by_worker()
    longest = max(per_worker)
    assert buffer.shape == (2 * longest,)  # two equal parts, the shorter one padded with zeros
    assert not buffer[per_worker[0]:longest].any() and not buffer[longest + per_worker[1]:].any()
    for g, v in zip(out, variables):
        if shard.owns(v):
            # The fake gave back the buffer: this worker's part plus the other's, each part summed once.
            assert g.shape == v.shape
        else:
            assert g is None


def test_a_bucket_that_would_pad_past_an_allreduce_is_all_reduced(fake_seam):
    calls = []
    fake_seam.second_worker()
    fake_seam.set(alltoall=recorded_alltoall(calls, size=4), size=4, rank=0)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64), keras.layers.Dense(1)])
    # 4 workers, one variable each: padding 4 segments to the 64x64 kernel would send > 2 x the bucket.
    variables = model.trainable_variables
    options = ReductionOptions(bucket_bytes=0)
    shard = sharding.Shard.make(variables, options, frozenset(), 0, 4)
    out, _ = sharding.reduce_scatter_gradients([tf.ones_like(v) for v in variables], variables, shard, options)
    assert calls == [] and fake_seam.calls == [("grouped_allreduce", 4, C.Average)]
    assert [g is not None for g in out] == [shard.owns(v) for v in variables]


def test_a_bucket_this_worker_owns_nothing_of_is_returned_as_unused(fake_seam, monkeypatch):
    calls = []
    fake_seam.set(size=2, rank=1, alltoall=recorded_alltoall(calls))
    model = stack((4, 8, 16, 8))
    variables = model.trainable_variables
    options = ReductionOptions(bucket_bytes=1)  # one bucket per variable: half of them are not this worker's
    shard = sharding.Shard.make(variables, options, frozenset(), 1, 2)
    monkeypatch.setattr(sharding, "balanced_groups", lambda groups, *_: [list(g) for g in groups])
    out, unused = sharding.reduce_scatter_gradients([tf.ones_like(v) for v in variables], variables, shard, options)
    assert len(calls) == len(variables)
    assert len(unused) == sum(1 for v in variables if not shard.owns(v)) > 0
    assert [g is not None for g in out] == [shard.owns(v) for v in variables]


def test_balanced_groups_merge_single_variable_buckets_until_the_parts_are_even():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,))] + [keras.layers.Dense(32, use_bias=False) for _ in range(4)])
    variables = model.trainable_variables  # four 32x32 kernels, one bucket each
    options = ReductionOptions(bucket_bytes=1)
    shard = sharding.Shard.make(variables, options, frozenset(), 0, 2)
    buckets = sharding.reduction.dense_groups(list(range(4)), variables, options)
    assert len(buckets) == 4
    groups = sharding.balanced_groups(buckets, variables, shard)
    assert groups == [buckets[0] + buckets[1], buckets[2] + buckets[3]]
    for group in groups:
        assert sorted(shard.owners[i] for i in group) == [0, 1]


def test_the_gather_assigns_every_variable_on_every_worker_so_no_allgather_is_pruned(hvd):
    """In a traced step, an allgather whose result nothing uses is pruned and the other workers wait forever:
    each worker assigns the whole bucket from the buffer, its own variables too."""
    model = stack((4, 8, 16, 8))
    variables = model.trainable_variables
    options = ReductionOptions(bucket_bytes=1)
    shard = sharding.Shard.make(variables, options, frozenset(), 0, 2)

    @tf.function
    def step():
        sharding.all_gather_variables(variables, shard, options)

    graph = step.get_concrete_function().graph
    gathers = [op for op in graph.get_operations() if op.type == "HorovodAllgather"]
    assigns = [op for op in graph.get_operations() if op.type == "AssignVariableOp"]
    groups = sharding.balanced_groups(sharding.reduction.dense_groups(list(range(len(variables))), variables, options),
                                      variables, shard)
    assert len(gathers) == len(groups) > 1 and len(assigns) == len(variables)
    for op in gathers:  # every gathered buffer feeds an assignment
        assert any(consumer.type != "NoOp" for out in op.outputs for consumer in out.consumers())


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


def test_reshard_keeps_the_owned_part_of_a_full_state():
    model = stack()
    variables = model.trainable_variables
    full = keras.optimizers.Adam(0.1)
    full.apply([tf.fill(v.shape, 0.5) for v in variables], variables)
    shard = sharding.Shard.make(variables, ReductionOptions(bucket_bytes=0), frozenset(), 1, 2)
    part = sharding.reshard(full, shard)
    assert int(part.iterations.numpy()) == 1
    owned = shard.owned()
    assert len(part.variables) == 2 + 2 * len(owned)
    for k, var in enumerate(owned):
        i = full._get_variable_index(var)
        np.testing.assert_array_equal(part._momentums[k].numpy(), full._momentums[i].numpy())
        np.testing.assert_array_equal(part._velocities[k].numpy(), full._velocities[i].numpy())


def test_assign_state_takes_the_owned_entries_of_a_full_state():
    model = stack()
    variables = model.trainable_variables
    full = keras.optimizers.SGD(0.1, momentum=0.9)
    full.build(variables)
    layout = sharding.full_layout(full, variables)
    values = [np.full(v.shape, float(j)) for j, v in enumerate(full.variables)]
    shard = sharding.Shard.make(variables, ReductionOptions(bucket_bytes=0), frozenset(), 0, 2)
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
    assert list(params)[-1] == "shard_optimizer_state"
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
