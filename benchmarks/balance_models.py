"""The models of the sharding benchmarks (benchmarks/sharding_worker.py, balance_step_worker.py) and one batch of
this worker's data for each.

- "stack": LAYERS x Dense(WIDTH), the data its own target;
- "mlp": Dense(32->256), Dense(256->256), Dense(256->4), where the 256x256 kernel is 87% of the parameters;
- "embedding": an Embedding(2000, 64) of 30% of the parameters, averaged, then Dense(512), Dense(512), Dense(4).
"""

from __future__ import annotations

import keras
import tensorflow as tf

MODELS = ("stack", "mlp", "embedding")


def make_model(kind: str, width: int = 0, layers: int = 0) -> keras.Model:
    """A new model of `kind` (its weights from Keras's seeded initializers: call keras.utils.set_random_seed first)."""
    if kind == "mlp":
        return keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                                 keras.layers.Dense(256, activation="relu"), keras.layers.Dense(4)])
    if kind == "embedding":
        return keras.Sequential([keras.Input((8,), dtype="int32"), keras.layers.Embedding(2000, 64),
                                 keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(512, activation="relu"),
                                 keras.layers.Dense(512, activation="relu"), keras.layers.Dense(4)])
    if kind == "stack":
        return keras.Sequential([keras.Input((width,))]
                                + [keras.layers.Dense(width, activation="relu") for _ in range(layers - 1)]
                                + [keras.layers.Dense(width)])
    raise ValueError(f"model: got {kind!r}, expected one of {MODELS}")


def make_batch(kind: str, batch: int, rank: int, width: int = 0) -> tuple[tf.Tensor, tf.Tensor]:
    """One batch (x, y) of `batch` examples for this worker's rank (each worker's data differs)."""
    if kind == "mlp":
        return (tf.random.stateless_normal((batch, 32), seed=(1, rank)),
                tf.random.stateless_normal((batch, 4), seed=(2, rank)))
    if kind == "embedding":
        return (tf.random.stateless_uniform((batch, 8), seed=(1, rank), maxval=2000, dtype="int32"),
                tf.random.stateless_normal((batch, 4), seed=(2, rank)))
    if kind == "stack":
        x = tf.random.stateless_normal((batch, width), seed=(1, rank))
        return x, x
    raise ValueError(f"model: got {kind!r}, expected one of {MODELS}")
