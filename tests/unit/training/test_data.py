"""shard() in one process, faking num_shards/index: disjoint, covering, equal shards."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdkeras import data
from hvdkeras.data import batch_slice, split_batch, split_batches


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 120), num_shards=st.integers(1, 7), batch=st.integers(1, 9),
       batch_first=st.booleans(), unknown=st.booleans())
def test_partition_properties(n, num_shards, batch, batch_first, unknown):
    base = tf.data.Dataset.range(n)
    if unknown:
        base = base.filter(lambda x: x >= 0)  # keeps everything, cardinality becomes unknown
    units = -(-n // batch) if batch_first else n
    if units < num_shards:
        with pytest.raises(ValueError, match="Received: a dataset of"):
            data.shard(base.batch(batch) if batch_first else base, num_shards=num_shards, index=0)
        return
    if batch_first:
        shards = [list(data.shard(base.batch(batch), num_shards=num_shards, index=i).as_numpy_iterator())
                  for i in range(num_shards)]
        assert len({len(s) for s in shards}) == 1  # equal numbers of batches
        flat = [int(v) for s in shards for b in s for v in b]
        assert len(flat) == len(set(flat))
        assert units - len(shards[0]) * num_shards < num_shards
    else:
        shards = [[int(v) for v in data.shard(base, num_shards=num_shards, index=i).as_numpy_iterator()]
                  for i in range(num_shards)]
        flat = [v for s in shards for v in s]
        assert len({len(s) for s in shards}) == 1
        assert len(flat) == len(set(flat))
        assert set(flat) <= set(range(n))
        assert n - len(flat) == n % num_shards
        batched = [list(data.shard(base, num_shards=num_shards, index=i).batch(batch)) for i in range(num_shards)]
        assert len({len(b) for b in batched}) == 1  # same steps after any batch()


def test_split_sizes():
    assert data.split_sizes(97, 2) == (48, 1)
    assert data.split_sizes(96, 4) == (24, 0)


def test_seeded_shuffle_keeps_shards_disjoint_and_changes_each_epoch():
    ds = [data.shard(tf.data.Dataset.range(40), num_shards=2, index=i, seed=3) for i in range(2)]
    epoch1 = [list(d.as_numpy_iterator()) for d in ds]
    epoch2 = [list(d.as_numpy_iterator()) for d in ds]
    assert sorted(epoch1[0] + epoch1[1]) == list(range(40))
    assert sorted(epoch2[0] + epoch2[1]) == list(range(40))
    assert epoch1 != epoch2
    again = [list(data.shard(tf.data.Dataset.range(40), num_shards=2, index=i, seed=3).as_numpy_iterator())
             for i in range(2)]
    assert again == epoch1  # same seed, same order: what every worker computes independently


def test_numpy_and_dicts():
    x = np.arange(10).reshape(10, 1)
    y = np.arange(10) * 10
    shard = list(data.shard((x, y), num_shards=3, index=1).as_numpy_iterator())
    assert [int(a[0]) for a, _ in shard] == [1, 4, 7]
    d = list(data.shard({"a": x, "b": y}, num_shards=2, index=0).as_numpy_iterator())
    assert [int(e["b"]) for e in d] == [0, 20, 40, 60, 80]


def _write_files(tmp_path, n_files, per_file):
    paths = []
    for f in range(n_files):
        path = str(tmp_path / f"part-{f}.tfrecord")
        with tf.io.TFRecordWriter(path) as w:
            for j in range(per_file + (f % 2)):
                w.write(str(f * 100 + j).encode())
        paths.append(path)
    return paths


@pytest.mark.parametrize("source", ["list", "list_files"])
def test_file_policy(tmp_path, source):
    paths = _write_files(tmp_path, 5, 4)
    if source == "list":
        ds = tf.data.TFRecordDataset(paths)
    else:
        ds = tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord"), shuffle=False).interleave(
            tf.data.TFRecordDataset, cycle_length=1)
    assert data.reads_files(ds)
    shards = [[int(v) for v in data.shard(ds, num_shards=2, index=i).as_numpy_iterator()] for i in range(2)]
    assert len(shards[0]) == len(shards[1])
    files_of = [{v // 100 for v in s} for s in shards]
    assert not files_of[0] & files_of[1]  # each worker reads its own files
    assert data.shard(ds, num_shards=2, index=0, policy="auto").cardinality() == len(shards[0])


def test_file_policy_errors(tmp_path):
    paths = _write_files(tmp_path, 2, 3)
    with pytest.raises(ValueError, match="fewer files than"):
        data.shard(tf.data.TFRecordDataset(paths), num_shards=3, index=0, policy="file")
    with pytest.raises(ValueError, match="policy='data'"):
        data.shard(tf.data.Dataset.range(10), num_shards=2, index=0, policy="file")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_shards": 0, "index": 0}, "Received: num_shards=0"),
        ({"num_shards": 2, "index": 2}, "Received: index=2"),
        ({"num_shards": 2, "index": -1}, "Received: index=-1"),
        ({"num_shards": 2, "index": 0, "policy": "rows"}, "Received: policy='rows'"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.shard(tf.data.Dataset.range(10), **kwargs)


def test_infinite_and_too_small():
    with pytest.raises(ValueError, match="infinite cardinality"):
        data.shard(tf.data.Dataset.range(5).repeat(), num_shards=2, index=0)
    with pytest.raises(ValueError, match="Received: a dataset of 1 elements for num_shards=2"):
        data.shard(tf.data.Dataset.range(1), num_shards=2, index=0)
    with pytest.raises(TypeError, match="Received: dataset of type str"):
        data.shard("data.csv", num_shards=2, index=0)


def test_remainder_reported_once(caplog):
    data.shard(tf.data.Dataset.range(97), num_shards=2, index=0)
    assert "dropped 1 of 97" in caplog.text


class Batches(keras.utils.PyDataset):
    def __init__(self, n):
        super().__init__(workers=1)
        self.n, self.epochs_ended = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((2, 1), i, "float32"), np.zeros((2, 1), "float32")

    def on_epoch_end(self):
        self.epochs_ended += 1


@pytest.mark.parametrize("equal, expected", [(True, [[0, 3], [1, 4], [2, 5]]), (False, [[0, 3, 6], [1, 4], [2, 5]])])
def test_shard_py_dataset_partitions_the_batches(equal, expected):
    source = Batches(7)
    shards = [data.shard_py_dataset(source, num_shards=3, index=i, equal=equal) for i in range(3)]
    assert [[int(s[j][0][0, 0]) for j in range(len(s))] for s in shards] == expected
    assert all(isinstance(s, keras.utils.PyDataset) for s in shards)
    shards[0].on_epoch_end()  # where a PyDataset reshuffles: the source's own hook runs
    assert source.epochs_ended == 1
    with pytest.raises(IndexError):
        shards[0][len(shards[0])]


def test_shard_py_dataset_needs_a_length_and_a_batch_per_worker():
    with pytest.raises(ValueError, match="at least one batch per worker. Received: a Batches of 1 batches"):
        data.shard_py_dataset(Batches(1), num_shards=2, index=0)


# ------------------------------------------------------------------------------ the global batch convention
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 200), num_shards=st.integers(1, 9))
def test_batch_slice_splits_a_batch_as_tf_distribute_does(rows, num_shards):
    parts = [batch_slice(rows, num_shards, i) for i in range(num_shards)]
    if rows < num_shards:
        assert parts == [(0, rows)] * num_shards  # too small to split: every worker takes it whole
        return
    sizes = [size for _, size in parts]
    assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert [start for start, _ in parts] == [sum(sizes[:i]) for i in range(num_shards)]
    tensors = [batch_slice(tf.constant(rows), num_shards, i) for i in range(num_shards)]
    assert [(int(a), int(b)) for a, b in tensors] == parts


def test_batch_slice_of_33_rows_over_2_workers():
    assert [batch_slice(33, 2, i) for i in (0, 1)] == [(0, 17), (17, 16)]


def test_split_batch_cuts_every_leaf_and_keeps_scalars():
    batch = ({"a": np.arange(6), "b": np.arange(12).reshape(6, 2)}, np.arange(6) * 10, np.float32(3.0))
    mine = split_batch(batch, num_shards=3, index=1)
    assert mine[0]["a"].tolist() == [2, 3] and mine[0]["b"].tolist() == [[4, 5], [6, 7]]
    assert mine[1].tolist() == [20, 30] and mine[2] == np.float32(3.0)
    ragged = tf.ragged.constant([[1], [2, 2], [3], [4, 4, 4]])
    sparse = tf.sparse.from_dense(tf.constant([[1, 0], [0, 2], [3, 0], [0, 4]]))
    r, s = split_batch((ragged, sparse), num_shards=2, index=1)
    assert r.to_list() == [[3], [4, 4, 4]] and tf.sparse.to_dense(s).numpy().tolist() == [[3, 0], [0, 4]]
    with pytest.raises(ValueError, match="at least one array with a batch dimension"):
        split_batch((np.float32(1.0),), num_shards=2, index=0)


def test_split_batches_of_a_py_dataset_and_bad_input():
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return np.arange(4) + 4 * i, np.zeros(4)

    split = split_batches(Batches(), num_shards=2, index=0)
    assert isinstance(split, keras.utils.PyDataset) and len(split) == 2 and split.num_batches == 2
    assert [split[i][0].tolist() for i in range(2)] == [[0, 1], [4, 5]]
    with pytest.raises(TypeError, match="Received: data of type list"):
        split_batches([1, 2], num_shards=2, index=0)


def test_steps_per_epoch_larger_than_the_shard(hvd, monkeypatch, fake_seam):
    fake_seam.set(size=2)
    shard = tf.data.Dataset.range(10).batch(2)  # 5 batches on this worker
    data.check_steps(shard, 5)
    with pytest.raises(ValueError, match=r"holds: 5 batches .*Received: steps_per_epoch=6"):
        data.check_steps(shard, 6)
    data.check_steps(shard.repeat(), 1000)  # repeated: nothing to check
    with pytest.raises(ValueError, match=r"holds: 2 batches .*Received: steps_per_epoch=3"):
        data.check_steps((np.zeros((40, 2)), np.zeros(40)), 3, batch_size=32)


def test_unbatched_dataset_warns_and_is_not_refused():
    # A guess only: Keras accepts input one dimension short where the model adds the axis (Input((28, 28, 1))
    # fed (N, 28, 28)), so hvdkeras warns and lets Keras decide.
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3), "float32"), np.zeros(8)))
    with pytest.warns(UserWarning, match="one dimension less than the model's inputs.*Received: a dataset with "
                                         "element_spec=.*model input ranks \\[2\\]"):
        assert data.check_batched(ds, [2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not data.check_batched(ds.batch(4), [2])
