"""Per-worker sharding of input pipelines with equal steps on every worker.

The most common way a data-parallel job fails is a hang: one worker runs out of data a step earlier and
the others wait in the allreduce forever. `shard` therefore always gives every worker the same number of
elements, dropping at most `num_shards - 1` of them (or batches, when sharding a batched dataset).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from hvdkeras import _collectives as C
from hvdkeras._checks import check_int
from hvdkeras.training import rank_zero

log = logging.getLogger("hvdkeras")

POLICIES = ("auto", "data", "file")
# Source datasets that read files: what TensorFlow's auto-shard rewrite can split by file.
_READER_OPS = {
    "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
    "FixedLengthRecordDatasetV2",
}
# Stages that shard a pipeline (Dataset.shard, tf.distribute's auto-shard).
_SHARD_OPS = {"ShardDataset", "AutoShardDataset", "ExperimentalAutoShardDataset"}
# Stages that make batches of elements.
_BATCH_OPS = {
    "BatchDataset", "BatchDatasetV2", "PaddedBatchDataset", "PaddedBatchDatasetV2", "PaddedBatchDatasetV3",
    "ParallelBatchDataset", "MapAndBatchDataset", "ExperimentalMapAndBatchDataset",
    "DenseToSparseBatchDataset", "ExperimentalDenseToSparseBatchDataset",
}


def _as_dataset(data: Any) -> tf.data.Dataset:
    if isinstance(data, tf.data.Dataset):
        return data
    if isinstance(data, (np.ndarray, dict, tuple, list)) or tf.is_tensor(data):
        return tf.data.Dataset.from_tensor_slices(tuple(data) if isinstance(data, list) else data)
    raise TypeError(
        "`dataset` must be a tf.data.Dataset, a numpy array, or a tuple/dict of arrays. "
        f"Received: dataset of type {type(data).__name__}"
    )


def _shard_position(num_shards: int | None, index: int | None) -> tuple[int, int]:
    """num_shards and index, defaulting to this job's size() and rank(), validated."""
    num_shards = check_int("num_shards", C.size() if num_shards is None else num_shards)
    return num_shards, check_int("index", C.rank() if index is None else index, 0, maximum=num_shards)


def split_sizes(n: int, num_shards: int) -> tuple[int, int]:
    """Elements per shard and the remainder dropped, for n elements over num_shards equal shards."""
    return n // num_shards, n % num_shards


def shard_arrays(
    arrays: Any, *, num_shards: int | None = None, index: int | None = None, equal: bool = True
) -> Any:
    """This worker's rows of numpy arrays (a nested structure of arrays with equal first dimensions).

    Rows `index, index + num_shards, ...` of the first `num_shards * (n // num_shards)` rows, so every worker
    gets `n // num_shards` rows; `None` entries stay `None`. This keeps arrays as arrays, so `fit`'s
    `batch_size` and `shuffle` still apply. With `equal=False` no row is dropped (shards differ by at most
    one row): right for evaluation, which needs no equal steps.

    Raises:
        ValueError: fewer rows than shards, or arrays of different lengths.

    Example:
        >>> x_mine, y_mine = hvdkeras.data.shard_arrays((x, y))
    """
    import keras

    num_shards, index = _shard_position(num_shards, index)
    lengths = {int(np.shape(a)[0]) for a in keras.tree.flatten(arrays) if a is not None}
    if len(lengths) > 1:
        raise ValueError(f"All arrays must have the same number of rows. Received: lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    per_shard, dropped = split_sizes(n, num_shards)
    if not equal:
        return keras.tree.map_structure(lambda a: None if a is None else a[index::num_shards], arrays)
    if per_shard == 0:
        raise ValueError(
            f"shard_arrays() needs at least one row per shard. Received: {n} rows for num_shards={num_shards}"
        )
    if dropped and rank_zero.is_rank_zero():
        log.warning("hvdkeras.data.shard_arrays: dropped %d of %d rows so each of %d workers gets %d.",
                    dropped, n, num_shards, per_shard)
    return keras.tree.map_structure(
        lambda a: None if a is None else a[: per_shard * num_shards][index::num_shards], arrays
    )


def check_steps(data: Any, steps_per_epoch: int | None, batch_size: int | None = None) -> None:
    """Raises when `steps_per_epoch` asks for more batches than this worker's shard holds.

    Args:
        data: this worker's dataset (batched) or arrays.
        steps_per_epoch: what `fit` was given.
        batch_size: for arrays, the batch size `fit` uses (Keras's default 32 when None).

    Raises:
        ValueError: steps_per_epoch is larger than the number of batches in the shard.
    """
    if steps_per_epoch is None:
        return
    if isinstance(data, tf.data.Dataset):
        batches = int(data.cardinality())
        if batches < 0:  # infinite (repeat) or unknown: nothing to check
            return
    else:
        import keras

        leaves = [a for a in keras.tree.flatten(data) if a is not None]
        if not leaves:
            return
        rows = int(np.shape(leaves[0])[0])
        batches = -(-rows // (batch_size or 32))
    if steps_per_epoch > batches:
        workers = C.size() if C.is_initialized() else 1
        raise ValueError(
            f"`steps_per_epoch` asks for more batches than this worker's shard holds: {batches} batches "
            f"(the data is split over {workers} workers, each gets 1/{workers} of it). "
            f"Received: steps_per_epoch={steps_per_epoch}. Use steps_per_epoch <= {batches}, or repeat() the data."
        )


def check_batched(dataset: Any, input_ranks: Sequence[int]) -> bool:
    """Warns when a dataset's inputs have one dimension less than the model's inputs (perhaps no `batch()`).

    Only a guess, so it never refuses: Keras itself accepts such input where the model takes it (a functional
    model whose `Input((28, 28, 1))` is fed arrays of shape (N, 28, 28) adds the trailing axis), and Keras
    raises its own error where it does not.

    Returns:
        Whether it warned.
    """
    if not isinstance(dataset, tf.data.Dataset) or not input_ranks:
        return False
    spec = dataset.element_spec
    x_spec = spec[0] if isinstance(spec, tuple) else spec
    import keras

    ranks = [len(s.shape) for s in keras.tree.flatten(x_spec) if hasattr(s, "shape") and s.shape.rank is not None]
    if ranks and len(ranks) == len(input_ranks) and all(r == m - 1 for r, m in zip(ranks, input_ranks)):
        warnings.warn(
            "hvdkeras: fit's dataset has one dimension less than the model's inputs: if it is not batched, call "
            ".batch(batch_size) on it (after hvdkeras.data.shard); if the model adds the axis itself, ignore this. "
            f"Received: a dataset with element_spec={spec}, model input ranks {list(input_ranks)}", stacklevel=3)
        return True
    return False


def _pipeline_ops(dataset: tf.data.Dataset) -> set[str]:
    """The names of the ops a tf.data pipeline is made of (its stages and the functions they run)."""
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph().numpy())
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return ops


def reads_files(dataset: tf.data.Dataset) -> bool:
    """True when the pipeline's source is a file reader (TFRecord, text lines, fixed-length records)."""
    return bool(_pipeline_ops(dataset) & _READER_OPS)


def loop_splittable(dataset: tf.data.Dataset) -> bool:
    """Whether a custom loop's dataset is one hvdkeras splits across the workers: it yields batches (a batching
    stage and no `unbatch()`), and the script did not shard it itself (`shard()`, as Horovod's TF2 examples
    do, each worker then reading its own part already)."""
    ops = _pipeline_ops(dataset)
    return bool(ops & _BATCH_OPS) and not ops & {"UnbatchDataset", "ExperimentalUnbatchDataset", *_SHARD_OPS}


def shards_itself(dataset: tf.data.Dataset) -> bool:
    """Whether a dataset's pipeline shards its data itself (a `shard()` stage)."""
    return bool(_pipeline_ops(dataset) & _SHARD_OPS)


def _count(dataset: tf.data.Dataset) -> int:
    return int(dataset.reduce(np.int64(0), lambda count, _: count + 1))


def _shard_by_file(dataset: tf.data.Dataset, num_shards: int, index: int) -> tf.data.Dataset:
    from tensorflow.python.data.experimental.ops.distribute import _AutoShardDataset

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    return _AutoShardDataset(dataset.with_options(options), num_shards, index)


def _is_this_job(num_shards: int, index: int) -> bool:
    return C.is_initialized() and C.size() == num_shards and C.rank() == index and num_shards > 1


def shard(
    dataset: Any,
    *,
    policy: str = "auto",
    num_shards: int | None = None,
    index: int | None = None,
    seed: int | None = None,
    shuffle_buffer_size: int | None = None,
) -> tf.data.Dataset:
    """This worker's shard of a dataset, with exactly as many elements as every other worker's.

    Policies:
        "data": element-wise, disjoint shards (element i goes to shard i % num_shards).
        "file": the pipeline reads files (`TFRecordDataset` over a file list, `Dataset.list_files` then
            `interleave`); each worker reads its own files.
        "auto": "file" when the pipeline reads files, "data" otherwise.

    Sharding before `batch()` shards elements: with `batch(b)` after it, the global batch is
    `num_shards * b`. Sharding a batched dataset shards whole batches: each worker takes whole batches of
    b, so the global batch is again `num_shards * b`, and what is dropped is counted in batches.

    Equal steps: with a known cardinality n, every shard gets `n // num_shards` elements. With an unknown
    cardinality (a `filter`, file sharding) every worker counts its shard once (one pass over its data)
    and all agree on the smallest count. The dropped remainder is logged once, on rank 0.

    Args:
        dataset: a finite `tf.data.Dataset`, a numpy array, or a tuple/dict of arrays (as passed to `fit`).
        policy: "auto", "data" or "file".
        num_shards: number of shards; defaults to `hvdkeras.size()`.
        index: this worker's shard; defaults to `hvdkeras.rank()`.
        seed: shuffle with this seed before sharding (every worker alike, so shards stay disjoint and
            cover the data); the order changes each epoch, identically on all workers.
        shuffle_buffer_size: the shuffle buffer; defaults to the whole dataset when its size is known,
            else 10,000.

    Returns:
        The shard, a `tf.data.Dataset`.

    Raises:
        ValueError: an infinite dataset, fewer elements (or files) than shards, index outside
            [0, num_shards), num_shards < 1, an unknown policy.
        TypeError: an input that is not a dataset or arrays.

    Example:
        >>> ds = hvdkeras.data.shard(tf.data.Dataset.from_tensor_slices((x, y)), seed=0).batch(32)
        >>> model.fit(ds, epochs=5)
    """
    dataset = _as_dataset(dataset)
    if policy not in POLICIES:
        raise ValueError(f"`policy` must be one of {POLICIES}. Received: policy={policy!r}")
    num_shards, index = _shard_position(num_shards, index)
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ValueError(
            "shard() needs a finite dataset to give every worker the same number of steps. Received: a dataset "
            "with infinite cardinality (repeat() without a count). Call shard() before repeat()."
        )
    by_file = policy == "file" or (policy == "auto" and reads_files(dataset))
    if by_file and policy == "file" and not reads_files(dataset):
        raise ValueError(
            "policy='file' needs a pipeline that reads files (TFRecordDataset, TextLineDataset, ...). "
            f"Received: a dataset whose source reads no files ({dataset.element_spec}). Use policy='data'."
        )
    if seed is not None and not by_file:
        buffer = shuffle_buffer_size or (cardinality if cardinality > 0 else 10_000)
        dataset = dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)

    def make(i: int) -> tf.data.Dataset:
        return _shard_by_file(dataset, num_shards, i) if by_file else dataset.shard(num_shards, i)

    def count(i: int) -> int:
        try:
            return _count(make(i))
        except tf.errors.InvalidArgumentError as err:
            if not by_file:
                raise
            raise ValueError(
                f"policy='file' cannot split this pipeline's files into {num_shards} shards: fewer files than "
                f"workers. Write at least one file per worker, or use policy='data'. Received from "
                f"TensorFlow: {err.message.split(' If you are using')[0]}"
            ) from None

    if cardinality >= 0 and not by_file:
        per_shard, dropped = split_sizes(cardinality, num_shards)
        total = cardinality
    elif _is_this_job(num_shards, index):
        own = count(index)
        per_shard = int(C.allreduce(tf.constant(own, tf.int64), op=C.Min, name="hvdkeras.data.count"))
        total = int(C.allreduce(tf.constant(own, tf.int64), op=C.Sum, name="hvdkeras.data.total"))
        dropped = total - per_shard * num_shards
    else:
        counts = [count(i) for i in range(num_shards)]
        per_shard, total = min(counts), sum(counts)
        dropped = total - per_shard * num_shards
    if per_shard == 0:
        what = "files hold elements" if by_file else "elements"
        raise ValueError(
            f"shard() needs at least one element per shard, but some of the {num_shards} shards are empty: "
            f"fewer {what} than workers. Received: a dataset of {total} elements for num_shards={num_shards}"
            + (" (policy='file' splits by file: write at least one file per worker)" if by_file else "")
        )
    if dropped and rank_zero.is_rank_zero():
        log.warning(
            "hvdkeras.data.shard: dropped %d of %d %s so each of %d workers gets %d (equal steps).",
            dropped, total, "elements (batches, if the dataset was batched)", num_shards, per_shard,
        )
    result = make(index).take(per_shard)
    if seed is not None and by_file:
        result = result.shuffle(shuffle_buffer_size or 10_000, seed=seed, reshuffle_each_iteration=True)
    if cardinality < 0 or by_file:
        result = result.apply(tf.data.experimental.assert_cardinality(per_shard))
    return result


def shard_py_dataset(dataset: Any, *, num_shards: int | None = None, index: int | None = None,
                     equal: bool = True) -> Any:
    """This worker's batches of a `keras.utils.PyDataset` (a Keras 3 `Sequence`), as a PyDataset.

    Batch i of the shard is batch `i * num_shards + index` of `dataset`, so the shards are disjoint and
    cover it; with `equal` (for training) every shard has `len(dataset) // num_shards` batches and the last
    `len(dataset) % num_shards` are dropped, with `equal=False` (for evaluation) none is. The dataset's
    `on_epoch_begin` / `on_epoch_end` (where a PyDataset reshuffles) and its worker settings carry over.

    Raises:
        ValueError: a PyDataset without a length (infinite), or fewer batches than shards.
    """
    import keras

    num_shards, index = _shard_position(num_shards, index)
    total = dataset.num_batches
    if total is None:
        raise ValueError("shard_py_dataset needs a PyDataset with a length (__len__) to give every worker the "
                         f"same number of steps. Received: {type(dataset).__name__} with num_batches=None")
    per_shard, dropped = split_sizes(total, num_shards)
    if per_shard == 0:
        raise ValueError(f"shard_py_dataset needs at least one batch per worker. Received: a "
                         f"{type(dataset).__name__} of {total} batches for num_shards={num_shards}")
    length = per_shard if equal else len(range(index, total, num_shards))
    if equal and dropped and rank_zero.is_rank_zero():
        log.warning("hvdkeras.data.shard_py_dataset: dropped %d of %d batches so each of %d workers gets %d "
                    "(equal steps).", dropped, total, num_shards, per_shard)

    class PyDatasetShard(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(workers=dataset.workers, use_multiprocessing=dataset.use_multiprocessing,
                             max_queue_size=dataset.max_queue_size)

        def __len__(self):
            return length

        def __getitem__(self, i):
            if not 0 <= i < length:
                raise IndexError(f"batch {i} of a shard of {length} batches")
            return dataset[i * num_shards + index]

        def on_epoch_begin(self):
            dataset.on_epoch_begin()

        def on_epoch_end(self):
            dataset.on_epoch_end()

    return PyDatasetShard()


# ------------------------------------------------------------------------------ the global batch convention
def batch_slice(rows: Any, num_shards: int, index: int) -> tuple[Any, Any]:
    """Where this worker's part of a global batch of `rows` rows starts, and how many rows it has.

    As tf.distribute splits a global batch over its replicas: every worker gets `rows // num_shards` rows and
    the first `rows % num_shards` workers one more (33 rows over 2 workers: 17 and 16). A batch with fewer
    rows than workers (the last, partial batch of an epoch) goes whole to every worker: each computes the
    gradient of the whole batch, and their average is that gradient, so no worker trains on an empty batch.
    Works on Python ints and on scalar tensors alike.
    """
    if isinstance(rows, (int, np.integer)):
        if rows < num_shards:
            return 0, int(rows)
        base, extra = divmod(int(rows), num_shards)
        return index * base + min(index, extra), base + (1 if index < extra else 0)
    rows = tf.cast(rows, tf.int64)
    base, extra = rows // num_shards, rows % num_shards
    whole = rows < num_shards
    start = tf.where(whole, tf.constant(0, tf.int64), index * base + tf.minimum(tf.constant(index, tf.int64), extra))
    size = tf.where(whole, rows, base + tf.cast(index < extra, tf.int64))
    return start, size


def _rows(leaf: Any) -> Any:
    """The batch dimension of one leaf, or None for a scalar (a leaf that is not split)."""
    if isinstance(leaf, tf.SparseTensor):
        return leaf.dense_shape[0]
    if isinstance(leaf, tf.RaggedTensor):
        return leaf.nrows()
    if tf.is_tensor(leaf):
        return None if leaf.shape.rank == 0 else tf.shape(leaf, out_type=tf.int64)[0]
    return None if np.ndim(leaf) == 0 else len(leaf)


def _cut(leaf: Any, start: Any, size: Any) -> Any:
    if _rows(leaf) is None:
        return leaf
    if isinstance(leaf, tf.SparseTensor):
        begin = tf.concat([[start], tf.zeros([leaf.shape.rank - 1], tf.int64)], 0)
        return tf.sparse.slice(leaf, begin, tf.concat([[size], leaf.dense_shape[1:]], 0))
    return leaf[start:start + size]


def split_batch(batch: Any, *, num_shards: int | None = None, index: int | None = None) -> Any:
    """This worker's rows of one global batch (a nested structure of arrays or tensors), see `batch_slice`."""
    import keras

    num_shards, index = _shard_position(num_shards, index)
    rows = [r for r in (_rows(leaf) for leaf in keras.tree.flatten(batch) if leaf is not None) if r is not None]
    if not rows:
        raise ValueError(f"A batch must hold at least one array with a batch dimension. Received: {batch!r}")
    start, size = batch_slice(rows[0], num_shards, index)
    return keras.tree.map_structure(lambda leaf: _cut(leaf, start, size), batch)


def split_batches(
    data: Any, *, num_shards: int | None = None, index: int | None = None
) -> Any:
    """Keras's batch convention across workers: every batch of `data` is a global batch, of which this worker
    takes its rows (see `batch_slice`).

    Every worker reads all of `data` (as tf.distribute's DATA auto-shard policy does) and keeps its part of
    each batch, so all workers take the same number of steps, which is the single process's, and together
    they train on exactly its batches. Infinite datasets and generators work too.

    Args:
        data: a batched `tf.data.Dataset`, a `keras.utils.PyDataset`, or a Python generator / iterator of
            batches.
        num_shards: number of workers; defaults to `hvdkeras.size()`.
        index: this worker; defaults to `hvdkeras.rank()`.

    Returns:
        The same kind of input, yielding this worker's part of every batch.

    Raises:
        TypeError: another kind of input.

    Example:
        >>> model.fit(hvdkeras.data.split_batches(dataset.batch(64)))  # 32 rows per worker on 2 workers
    """
    import keras

    num_shards, index = _shard_position(num_shards, index)
    if not splittable(data):
        raise TypeError("split_batches() takes a batched tf.data.Dataset, a keras.utils.PyDataset or a generator of "
                        f"batches. Received: data of type {type(data).__name__}")
    if isinstance(data, tf.data.Dataset):
        def mine(*batch):
            return split_batch(batch if len(batch) > 1 else batch[0], num_shards=num_shards, index=index)

        return data.map(mine, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if isinstance(data, keras.utils.PyDataset):
        return _split_py_dataset(data, num_shards, index)
    return (split_batch(batch, num_shards=num_shards, index=index) for batch in data)


def splittable(data: Any) -> bool:
    """Whether `split_batches` takes `data`: a tf.data.Dataset, a keras.utils.PyDataset, or a generator (an
    iterator) of batches."""
    import keras

    return isinstance(data, (tf.data.Dataset, keras.utils.PyDataset)) or hasattr(data, "__next__")


def _split_py_dataset(dataset: Any, num_shards: int, index: int) -> Any:
    import keras

    class PyDatasetSplit(keras.utils.PyDataset):
        """Batch i is this worker's part of batch i of the global PyDataset."""

        def __init__(self):
            super().__init__(workers=dataset.workers, use_multiprocessing=dataset.use_multiprocessing,
                             max_queue_size=dataset.max_queue_size)

        @property
        def num_batches(self):
            return dataset.num_batches

        def __len__(self):
            return len(dataset)

        def __getitem__(self, i):
            return split_batch(dataset[i], num_shards=num_shards, index=index)

        def on_epoch_begin(self):
            dataset.on_epoch_begin()

        def on_epoch_end(self):
            dataset.on_epoch_end()

    return PyDatasetSplit()
