"""Helpers shared by the worker scripts that the multi-worker tests launch."""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import random
import sys

import numpy as np

# A hung worker prints where it is stuck before the launcher's timeout kills it.
faulthandler.dump_traceback_later(float(os.environ.get("HVDKERAS_TEST_DUMP_AFTER", "200")), exit=True,
                                  file=sys.stderr)


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
    path = os.path.join(out_dir(), f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    os.replace(path + ".tmp", path)


def weights_digest(variables) -> str:
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(np.asarray(v)).tobytes())
    return h.hexdigest()


def max_abs_diff(a, b) -> float:
    return float(max(np.max(np.abs(np.asarray(x) - np.asarray(y))) for x, y in zip(a, b)))


def max_rel_diff(a, b) -> float:
    return float(
        max(np.max(np.abs(np.asarray(x) - np.asarray(y))) / (np.max(np.abs(np.asarray(y))) + 1e-12)
            for x, y in zip(a, b))
    )
