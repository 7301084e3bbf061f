"""Helpers shared by the worker scripts that the multi-worker tests launch."""

from __future__ import annotations

import faulthandler
import os
import random
import sys

import numpy as np

# A hung worker prints where it is stuck before the launcher's timeout kills it.
faulthandler.dump_traceback_later(float(os.environ.get("HVDKERAS_TEST_DUMP_AFTER", "200")), exit=True,
                                  file=sys.stderr)


# Process sets that scenarios.py registered at init, for the scenario that uses them.
PROCESS_SETS: list | None = None


def seed_everything(seed: int) -> None:
    import keras
    import tensorflow as tf

    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)
    keras.utils.set_random_seed(seed)


def out_dir() -> str:
    return os.environ["HVDKERAS_TEST_OUT"]


def write_result(rank: int, result: dict) -> None:
    from hvdkeras.training.saving import write_json_atomically

    write_json_atomically(os.path.join(out_dir(), f"rank{rank}.json"), result)


def weights_digest(variables) -> str:
    from hvdkeras.wrap import weights_digest as digest

    return digest(variables)


def max_abs_diff(a, b) -> float:
    return float(max(np.max(np.abs(np.asarray(x) - np.asarray(y))) for x, y in zip(a, b)))


def max_rel_diff(a, b) -> float:
    return float(
        max(np.max(np.abs(np.asarray(x) - np.asarray(y))) / (np.max(np.abs(np.asarray(y))) + 1e-12)
            for x, y in zip(a, b))
    )


def count_collectives():
    """Counts every reduction call of hvdkeras's seam (a fused call counts once), in eager and traced code.

    Wraps the seam's allreduce, grouped_allreduce, allgather and reducescatter with a counter variable that
    the traced step bumps when it runs; returns a function that reads the count.
    """
    import functools

    import tensorflow as tf

    from hvdkeras import _collectives

    with tf.init_scope():
        counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="test_reductions")

    def counted(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            counter.assign_add(1)
            return fn(*args, **kwargs)

        return call

    for name in ("allreduce", "grouped_allreduce", "allgather", "reducescatter"):
        setattr(_collectives, name, counted(getattr(_collectives, name)))
    return lambda: int(counter.numpy())
