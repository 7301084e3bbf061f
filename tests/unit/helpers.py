"""Small models the unit tests share."""

import keras


def small_model():
    """Dense(2) on 3 inputs, seeded: a kernel (3, 2) and a bias (2,)."""
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
