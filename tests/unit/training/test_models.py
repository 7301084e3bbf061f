"""hvdkeras.training.models: the optimizers a model holds (readying a model for XLA: tests/unit/test_xla.py)."""

import keras

from hvdkeras.training import models

from ..helpers import small_model


def test_held_optimizers_lists_compiles_first_then_the_others_by_name(hvd):
    model = small_model()
    model.compile(optimizer=keras.optimizers.SGD(), loss="mse")
    model.g_optimizer = keras.optimizers.Adam()
    model.a_optimizer = model.optimizer  # the same object once
    assert list(models.held_optimizers(model)) == ["optimizer", "g_optimizer"]
