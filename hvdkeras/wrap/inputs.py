"""fit's and evaluate's data under the wrap: each worker's share, with equal steps, under the batch convention."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.training import data
from hvdkeras.wrap.report import weights_digest
from hvdkeras.wrap.state import warn_once


def is_arrays(value: Any) -> bool:
    leaves = [v for v in keras.tree.flatten(value) if v is not None]
    return bool(leaves) and all(isinstance(v, np.ndarray) or tf.is_tensor(v) for v in leaves)


def shard_for_training(x, y, sw):
    """Equal steps on every worker: datasets through data.shard, arrays through data.shard_arrays."""
    if is_arrays((x, y, sw)):
        return data.shard_arrays((x, y, sw))
    if isinstance(x, tf.data.Dataset) and x.cardinality() != tf.data.INFINITE_CARDINALITY:
        return data.shard(x), y, sw
    if is_py_dataset(x):
        return data.shard_py_dataset(x), y, sw
    unshardable(x, "x")
    return x, y, sw


def is_py_dataset(value: Any) -> bool:
    return isinstance(value, keras.utils.PyDataset) and value.num_batches is not None


def shard_for_evaluation(value: Any) -> Any:
    """Evaluation has no per-step collectives: shard without dropping anything, so the metrics are exact."""
    if isinstance(value, tf.data.Dataset):
        if value.cardinality() == tf.data.INFINITE_CARDINALITY:
            unshardable(value, "an infinite evaluation dataset")
            return value
        return value.shard(C.size(), C.rank())
    if is_arrays(value):
        return data.shard_arrays(value, equal=False)
    if is_py_dataset(value):
        return data.shard_py_dataset(value, equal=False)
    unshardable(value, "validation data")
    return value


def unshardable(value: Any, what: str) -> None:
    if value is not None:
        warn_once(f"shard-{what}-{type(value).__name__}",
                   f"{what} of type {type(value).__name__} cannot be sharded: every worker reads all of it "
                   "(shard it in the script and run with --no-shard)")


def sharded_fit_inputs(kwargs: dict, batch: str) -> dict:
    """fit's training and validation data for this worker, under the batch convention `batch`."""
    x, y, sw = kwargs.get("x"), kwargs.get("y"), kwargs.get("sample_weight")
    validation = kwargs.get("validation_data")
    split = kwargs.get("validation_split") or 0.0
    if split and validation is None and is_arrays((x, y, sw)):
        # Split the whole arrays the way Keras does (the last fraction), then shard both parts, so the
        # workers' validation sets together are the single-worker validation set.
        n = int(np.shape(keras.tree.flatten(x)[0])[0])
        cut = int(np.floor(n * (1.0 - split)))
        vx, vy, vsw = keras.tree.map_structure(lambda a: None if a is None else a[cut:], (x, y, sw))
        x, y, sw = keras.tree.map_structure(lambda a: None if a is None else a[:cut], (x, y, sw))
        validation = (vx, vy) if vsw is None else (vx, vy, vsw)
        kwargs["validation_split"] = 0.0
    if batch == "global":
        kwargs.update(split_global_batches(x, y, sw, kwargs))
    else:
        kwargs["x"], kwargs["y"], kwargs["sample_weight"] = shard_for_training(x, y, sw)
    if validation is not None:
        kwargs["validation_data"] = shard_for_evaluation(validation)
    return kwargs


def split_global_batches(x, y, sw, kwargs: dict) -> dict:
    """Keras's convention: each batch fit makes of the data is a global batch, and this worker trains on its
    rows of it (data.split_batches). Arrays become the very batches Keras would make of them in one process
    (its own array adapter: the same shuffling, class weights and batch size), split."""
    if is_arrays((x, y, sw)):
        batches, batch_size = global_array_batches(x, y, sw, kwargs)
        return {"x": data.split_batches(batches), "y": None, "sample_weight": None, "class_weight": None,
                "batch_size": None, "shuffle": False,
                # Validation arrays keep the script's batch size (fit would take it from batch_size).
                "validation_batch_size": kwargs.get("validation_batch_size") or batch_size}
    if data.splittable(x):
        return {"x": data.split_batches(x)}
    unshardable(x, "x")
    return {"x": x, "y": y, "sample_weight": sw}


def global_array_batches(x, y, sw, kwargs: dict) -> tuple[tf.data.Dataset, int]:
    """The global batches of fit's arrays, the same on every worker, and their batch size.

    Keras's own array adapter makes them, so a script seeded alike on every worker (the usual reproducible
    script) trains exactly as in one process. Where the workers' first batches differ (a script that seeds
    nothing, or seeds by rank), Keras's shuffling differs between them, and the batches are made here
    instead: the same rows shuffled with one seed chosen by rank 0, anew every epoch.
    """
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    shuffle = kwargs.get("shuffle", True)
    adapter = ArrayDataAdapter(x, y, sample_weight=sw, class_weight=kwargs.get("class_weight"), shuffle=shuffle,
                               batch_size=kwargs.get("batch_size"), steps=kwargs.get("steps_per_epoch"))
    batches = adapter.get_tf_dataset()
    if shuffle is True and C.size() > 1 and not same_on_every_worker(next(iter(batches))):
        n = int(np.shape(keras.tree.flatten(x)[0])[0])
        ordered = ArrayDataAdapter(x, y, sample_weight=sw, class_weight=kwargs.get("class_weight"), shuffle=False,
                                   batch_size=n).get_tf_dataset()
        rows = next(iter(ordered))  # every row, in order, with class weights as sample weights
        seed = C.broadcast_object(int(np.random.default_rng().integers(2**31)), root_rank=0,
                                  name="hvdkeras.wrap.shuffle_seed")
        order = tf.data.Dataset.range(n).shuffle(n, seed=seed, reshuffle_each_iteration=True).batch(adapter.batch_size)
        batches = order.map(lambda idx: keras.tree.map_structure(lambda a: tf.gather(a, idx), rows))
        warn_once("shuffle-seed", "the workers shuffle fit's arrays differently (the script does not seed them "
                                   "alike): hvdkeras shuffles them with one seed on every worker instead")
    if adapter.num_batches is not None:
        # Its cardinality is unknown to tf.data; Keras would take it from the adapter.
        batches = batches.apply(tf.data.experimental.assert_cardinality(adapter.num_batches))
    return batches, adapter.batch_size


def same_on_every_worker(batch: Any) -> bool:
    digest = weights_digest(keras.tree.flatten(batch))
    return len(set(C.allgather_object(digest, name="hvdkeras.wrap.first_batch"))) == 1


def model_input_ranks(model) -> list[int]:
    try:
        return [len(t.shape) for t in model.inputs or []]
    except (AttributeError, ValueError):  # a subclassed or not yet built model
        return []


def check_fit_inputs(model, kwargs: dict) -> None:
    x = kwargs.get("x")
    if isinstance(x, tf.data.Dataset):
        data.check_steps(x, kwargs.get("steps_per_epoch"))
    elif is_arrays(x):
        data.check_steps(x, kwargs.get("steps_per_epoch"), kwargs.get("batch_size"))
