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
from hvdkeras.reduce.shard import ALIGN, EVERY, Shard, partition


def stack(widths=(4, 8, 16, 2), seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((widths[0],))] + [keras.layers.Dense(w) for w in widths[1:]])


# ---------------------------------------------------------------------------------------------- partition
def owners(pieces):
    """Each variable's owner, for variables owned whole."""
    assert all(len(own) == 1 for own in pieces)
    return [own[0].owner for own in pieces]


def test_partition_balances_each_bucket_and_the_total_with_whole_variables():
    sizes = [100, 10, 100, 10, 50, 50, 7]
    got = owners(partition(sizes, [1] * 7, [False] * 7, [[0, 1, 2, 3], [4, 5, 6]], 2))
    assert got[0] != got[2] and got[4] != got[5]
    per = [sum(s for s, o in zip(sizes, got) if o == r) for r in (0, 1)]
    assert abs(per[0] - per[1]) <= 10


def test_partition_is_deterministic_and_leaves_unbucketed_variables_to_every_worker():
    sizes = [5, 5, 5, 5]
    args = (sizes, [5] * 4, [True, False, True, False], [[0, 1, 2]], 3)
    assert partition(*args) == partition(*args)
    assert owners([partition(*args)[3]]) == [EVERY]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_partition_cuts_a_dominant_variable_so_each_worker_owns_a_run_of_rows_of_about_1_over_n(n):
    # The MLP Dense(32->256), Dense(256->256), Dense(256->4), one bucket: whole, one worker held 0.87 of it.
    shapes = [(32, 256), (256,), (256, 256), (256,), (256, 4), (4,)]
    sizes = [int(np.prod(s)) for s in shapes]
    pieces = partition(sizes, [s[0] for s in shapes], [True] * 6, [list(range(6))], n)
    per = [0] * n
    for shape, own in zip(shapes, pieces):
        row = int(np.prod(shape[1:]))
        lo = 0
        for p in own:  # contiguous runs in row order, covering every row once
            assert p.lo == lo and p.hi > p.lo and 0 <= p.owner < n
            per[p.owner] += (p.hi - p.lo) * row
            lo = p.hi
        assert lo == shape[0]
        assert len({p.owner for p in own}) == len(own)  # at most one run of a variable per worker
    assert sum(per) == sum(sizes)
    assert max(per) <= sum(sizes) / n + 256  # within a row of 1/N (a row of 256 is a multiple of ALIGN)


def test_every_cut_falls_on_a_multiple_of_align_elements():
    shapes = [(16, 3), (1000,), (300, 7), (129, 64), (5,)]
    sizes = [int(np.prod(s)) for s in shapes]
    for n in (2, 3, 4):
        pieces = partition(sizes, [s[0] for s in shapes], [True] * 5, [list(range(5))], n)
        for shape, own in zip(shapes, pieces):
            row = int(np.prod(shape[1:]))
            assert all(p.lo * row % ALIGN == 0 for p in own)
        assert len(pieces[0]) == 1 and len(pieces[4]) == 1  # too small to cut on a boundary: whole


def test_an_aligned_piece_updates_to_the_same_bits_as_the_whole_variable_in_a_traced_step():
    """The reason for ALIGN: traced, RMSprop's division by a square root runs per SIMD packet, and a piece whose
    packets are not the whole variable's gives other bits (seen: 7e-9 after 20 steps, cut at element 333)."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(1000,)).astype("float32")
    grads = [rng.normal(size=(1000,)).astype("float32") for _ in range(20)]
    whole = keras.Variable(w)
    pieces = [keras.Variable(w[:ALIGN * 5]), keras.Variable(w[ALIGN * 5:])]
    opt_whole, opt_pieces = keras.optimizers.RMSprop(0.005), keras.optimizers.RMSprop(0.005)
    step_whole = tf.function(lambda g: opt_whole.apply([g], [whole]))
    step_pieces = tf.function(lambda g: opt_pieces.apply([g[:ALIGN * 5], g[ALIGN * 5:]], pieces))
    for g in grads:
        step_whole(tf.constant(g))
        step_pieces(tf.constant(g))
    got = np.concatenate([p.numpy() for p in pieces])
    assert np.array_equal(got.view(np.uint32), whole.numpy().view(np.uint32))


def test_a_variable_of_no_rows_is_owned_whole():
    pieces = partition([0, 1000, 10], [0, 10, 10], [True, True, False], [[0, 1, 2]], 2)
    assert len(pieces[0]) == 1 and (pieces[0][0].lo, pieces[0][0].hi) == (0, 0)


def test_partition_keeps_unsplittable_variables_whole_and_fills_around_them():
    sizes = [1000, 1000, 10]
    pieces = partition(sizes, [10, 10, 10], [False, True, True], [[0, 1, 2]], 2)
    assert len(pieces[0]) == 1 and pieces[0][0].hi == 10  # owned whole
    per = [0, 0]
    for size, own in zip(sizes, pieces):
        for p in own:
            per[p.owner] += (p.hi - p.lo) * size // 10
    assert per == [1000, 1010] or per == [1010, 1000]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_shard_gives_every_variable_one_owner(n):
    model = stack((4, 8, 16, 8, 2))
    variables = model.trainable_variables
    shard = Shard.make(variables, ReductionOptions(bucket_bytes=0), frozenset(), 0, n)
    assert sorted({p.owner for own in shard.pieces for p in own}) == list(range(n))
    assert sum(shard.elements_by_worker()) == sum(int(np.prod(v.shape)) for v in variables)
    assert [shard.owns(v) for v in variables] == [any(p.owner == 0 for p in own) for own in shard.pieces]


@pytest.mark.parametrize("n", [2, 4])
def test_a_splittable_shard_gives_each_worker_slice_variables_of_its_rows(n):
    model = stack((32, 256, 256, 4))
    variables = model.trainable_variables
    shards = [Shard.make(variables, ReductionOptions(), frozenset(), r, n, splittable=lambda v: True)
              for r in range(n)]
    total = sum(int(np.prod(v.shape)) for v in variables)
    assert max(shards[0].elements_by_worker()) <= total / n + 256
    for shard in shards:
        for i, (var, s) in enumerate(zip(variables, shard.slices)):
            p = shard.piece(i)
            if p is None:
                assert s is None
            elif shard.split(i):
                assert s is not var and tuple(s.shape) == (p.hi - p.lo,) + tuple(var.shape[1:])
                np.testing.assert_array_equal(s.numpy(), var.numpy()[p.lo:p.hi])
            else:
                assert s is var
        assert sum(int(np.prod(s.shape)) for s in shard.owned()) == shard.elements_by_worker()[shard.rank]


def test_variables_that_balance_whole_are_owned_whole_with_no_copies():
    model = stack((64, 64, 64, 64, 64))  # four equal layers
    variables = model.trainable_variables
    ids = {id(v) for v in variables}
    for rank in (0, 1):
        shard = Shard.make(variables, ReductionOptions(), frozenset(), rank, 2, splittable=lambda v: True)
        assert not any(shard.split(i) for i in range(len(variables)))
        assert all(id(s) in ids for s in shard.owned())  # the model's own variables: no copy of any part
        counts = shard.elements_by_worker()
        assert max(counts) <= sum(counts) * (1 / 2 + 0.01)


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
    groups = reduce_scatter.balanced_groups(buckets, variables, shard.pieces_of, shard.size)
    assert groups == [buckets[0] + buckets[1], buckets[2] + buckets[3]]
    for group in groups:
        assert sorted(shard.pieces[i][0].owner for i in group) == [0, 1]


def test_one_gather_per_dtype_assigns_every_variable_on_every_worker_so_it_is_not_pruned(hvd):
    """The weights of every bucket travel in one allgather per dtype. In a traced step, an allgather whose result
    nothing uses is pruned and the other workers wait forever: each worker assigns every variable from the
    buffer, its own too."""
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
                                            variables, shard.pieces_of, shard.size)
    assert len(groups) > 1 and len(gathers) == 1 and len(assigns) == len(variables)
    for op in gathers:  # every gathered buffer feeds an assignment
        assert any(consumer.type != "NoOp" for out in op.outputs for consumer in out.consumers())


def test_weights_over_gather_bytes_travel_in_the_reduce_scatter_groups(hvd, monkeypatch):
    """Above GATHER_BYTES of one dtype the weights are all-gathered group by group, as the reduce-scatter groups
    them, so that no worker holds a gathered copy of a large model at once; each buffer still feeds every one of
    its variables' assignments."""
    model = stack((4, 8, 16, 8))
    variables = model.trainable_variables
    options = ReductionOptions(bucket_bytes=1)
    shard = Shard.make(variables, options, frozenset(), 0, 2)
    total = sum(int(np.prod(v.shape)) * 4 for v in variables)
    groups = reduce_scatter.balanced_groups(dense_groups(list(range(len(variables))), variables, options),
                                            variables, shard.pieces_of, shard.size)

    def gathers_and_assigns():
        @tf.function
        def step():
            reduce_scatter.all_gather_variables(variables, shard, options)

        graph = step.get_concrete_function().graph
        ops = graph.get_operations()
        return ([op for op in ops if op.type == "HorovodAllgather"],
                [op for op in ops if op.type == "AssignVariableOp"])

    monkeypatch.setattr(reduce_scatter, "GATHER_BYTES", total)  # at the limit: one buffer
    gathers, assigns = gathers_and_assigns()
    assert len(gathers) == 1 and len(assigns) == len(variables)
    monkeypatch.setattr(reduce_scatter, "GATHER_BYTES", total - 1)  # over it: one per group
    gathers, assigns = gathers_and_assigns()
    assert len(groups) > 1 and len(gathers) == len(groups) and len(assigns) == len(variables)
    for op in gathers:
        assert any(consumer.type != "NoOp" for out in op.outputs for consumer in out.consumers())
