"""Handwritten digits bundled beside the examples (digits.csv.gz, 1,797 8x8 images): no download.

digits.csv.gz is the test set of the UCI Machine Learning Repository's "Optical Recognition of Handwritten
Digits" (E. Alpaydin and C. Kaynak, 1998; CC BY 4.0), the file scikit-learn ships as its `load_digits`: one row
per image, its 64 pixel counts (0-16) and then its digit.
"""

from pathlib import Path

import keras
import numpy as np

DIGITS_CSV = Path(__file__).resolve().parent / "digits.csv.gz"


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(x, y): the 1,797 images as rows of 64 pixel counts 0-16 (float64), and their digits (int64)."""
    rows = np.loadtxt(DIGITS_CSV, delimiter=",")
    return rows[:, :-1], rows[:, -1].astype("int64")


def load(validation_fraction: float = 0.2, seed: int = 0):
    """(x_train, y_train), (x_val, y_val): images scaled to [0, 1], shape (8, 8, 1), a fixed shuffle."""
    x, y = load_digits()
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
