"""hvdkeras.reduce.reduce_scatter in one process: the partition, the reduce-scatter packing (against the faked
seam), the balanced groups and the all-gather. The 2-worker behaviour: tests/multiworker/test_sharding_2w.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.reduce import reduce_scatter
from hvdkeras.reduce.groups import dense_groups
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.reduce.shard import EVERY, Shard, partition


def stack(widths=(4, 8, 16, 2), seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((widths[0],))] + [keras.layers.Dense(w) for w in widths[1:]])


# ---------------------------------------------------------------------------------------------- partition
def test_partition_balances_each_bucket_and_the_total():
    sizes = [100, 10, 100, 10, 50, 50, 7]
    owners = partition(sizes, [[0, 1, 2, 3], [4, 5, 6]], 2)
    assert owners[0] != owners[2] and owners[4] != owners[5]
    per = [sum(s for s, o in zip(sizes, owners) if o == r) for r in (0, 1)]
    assert abs(per[0] - per[1]) <= 10


def test_partition_is_deterministic_and_leaves_unbucketed_variables_to_every_worker():
    sizes = [5, 5, 5, 5]
    assert partition(sizes, [[0, 1, 2]], 2) == partition(sizes, [[0, 1, 2]], 2)
    assert partition(sizes, [[0, 1, 2]], 2)[3] == EVERY


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_shard_gives_every_variable_one_owner(n):
    model = stack((4, 8, 16, 8, 2))
    variables = model.trainable_variables
    shard = Shard.make(variables, ReductionOptions(bucket_bytes=0), frozenset(), 0, n)
    assert sorted(set(shard.owners)) == list(range(n))
    assert sum(shard.elements_by_worker()) == sum(int(np.prod(v.shape)) for v in variables)
    assert [shard.owns(v) for v in variables] == [o == 0 for o in shard.owners]


def test_more_workers_than_variables_is_a_clear_error():
    model = stack((3, 2))  # two variables
    with pytest.raises(ValueError, match=r"2 shared variables for 4 workers leave workers \[2, 3\]"):
        Shard.make(model.trainable_variables, ReductionOptions(bucket_bytes=0), frozenset(), 0, 4)


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
    shard = Shard.make(variables, options, frozenset(), rank, 2)
    grads = [tf.fill(v.shape, float(i + 1)) for i, v in enumerate(variables)]
    out, unused = reduce_scatter.reduce_scatter_gradients(grads, variables, shard, options)
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
    shard = Shard.make(variables, options, frozenset(), 0, 4)
    out, _ = reduce_scatter.reduce_scatter_gradients([tf.ones_like(v) for v in variables], variables, shard, options)
    assert calls == [] and fake_seam.calls == [("grouped_allreduce", 4, C.Average)]
    assert [g is not None for g in out] == [shard.owns(v) for v in variables]


def test_a_bucket_this_worker_owns_nothing_of_is_returned_as_unused(fake_seam, monkeypatch):
    calls = []
    fake_seam.set(size=2, rank=1, alltoall=recorded_alltoall(calls))
    model = stack((4, 8, 16, 8))
    variables = model.trainable_variables
    options = ReductionOptions(bucket_bytes=1)  # one bucket per variable: half of them are not this worker's
    shard = Shard.make(variables, options, frozenset(), 1, 2)
    monkeypatch.setattr(reduce_scatter, "balanced_groups", lambda groups, *_: [list(g) for g in groups])
    grads = [tf.ones_like(v) for v in variables]
    out, unused = reduce_scatter.reduce_scatter_gradients(grads, variables, shard, options)
    assert len(calls) == len(variables)
    assert len(unused) == sum(1 for v in variables if not shard.owns(v)) > 0
    assert [g is not None for g in out] == [shard.owns(v) for v in variables]


def test_balanced_groups_merge_single_variable_buckets_until_the_parts_are_even():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,))] + [keras.layers.Dense(32, use_bias=False) for _ in range(4)])
    variables = model.trainable_variables  # four 32x32 kernels, one bucket each
    options = ReductionOptions(bucket_bytes=1)
    shard = Shard.make(variables, options, frozenset(), 0, 2)
    buckets = dense_groups(list(range(4)), variables, options)
    assert len(buckets) == 4
    groups = reduce_scatter.balanced_groups(buckets, variables, shard.owner, shard.size)
    assert groups == [buckets[0] + buckets[1], buckets[2] + buckets[3]]
    for group in groups:
        assert sorted(shard.owners[i] for i in group) == [0, 1]


def test_the_gather_assigns_every_variable_on_every_worker_so_no_allgather_is_pruned(hvd):
    """In a traced step, an allgather whose result nothing uses is pruned and the other workers wait forever:
    each worker assigns the whole bucket from the buffer, its own variables too."""
    model = stack((4, 8, 16, 8))
    variables = model.trainable_variables
    options = ReductionOptions(bucket_bytes=1)
    shard = Shard.make(variables, options, frozenset(), 0, 2)

    @tf.function
    def step():
        reduce_scatter.all_gather_variables(variables, shard, options)

    graph = step.get_concrete_function().graph
    gathers = [op for op in graph.get_operations() if op.type == "HorovodAllgather"]
    assigns = [op for op in graph.get_operations() if op.type == "AssignVariableOp"]
    groups = reduce_scatter.balanced_groups(dense_groups(list(range(len(variables))), variables, options),
                                            variables, shard.owner, shard.size)
    assert len(gathers) == len(groups) > 1 and len(assigns) == len(variables)
    for op in gathers:  # every gathered buffer feeds an assignment
        assert any(consumer.type != "NoOp" for out in op.outputs for consumer in out.consumers())
