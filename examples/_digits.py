"""The handwritten digits that scikit-learn ships in its package (1,797 8x8 images): no download."""

import keras
import numpy as np
from sklearn.datasets import load_digits


def load(validation_fraction: float = 0.2, seed: int = 0):
    """(x_train, y_train), (x_val, y_val): images scaled to [0, 1], shape (8, 8, 1), a fixed shuffle."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).reshape(-1, 8, 8, 1).astype("float32")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order].astype("int64")
    cut = int(len(x) * (1 - validation_fraction))
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def cnn(seed: int = 1) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
