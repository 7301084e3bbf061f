"""hvdkeras.models: the optimizers a model holds, and XLA turned off only where a distributed optimizer is held."""

import keras
import pytest

from hvdkeras import models
from hvdkeras.optimizer import DistributedOptimizer

from .helpers import small_model


def test_held_optimizers_lists_compiles_first_then_the_others_by_name(hvd):
    model = small_model()
    model.compile(optimizer=keras.optimizers.SGD(), loss="mse")
    model.g_optimizer = keras.optimizers.Adam()
    model.a_optimizer = model.optimizer  # the same object once
    assert list(models.held_optimizers(model)) == ["optimizer", "g_optimizer"]


@pytest.mark.parametrize("distributed, jit, turned_off", [(True, True, True), (True, False, False),
                                                           (False, True, False)])
def test_xla_is_turned_off_only_for_a_distributed_optimizer(hvd, caplog, distributed, jit, turned_off):
    model = small_model()
    optimizer = keras.optimizers.SGD()
    model.compile(optimizer=DistributedOptimizer(optimizer) if distributed else optimizer, loss="mse",
                  jit_compile=jit)
    model.train_function = object()
    assert models.ensure_not_jit_compiled(model) is turned_off
    assert model.jit_compile is (jit and not turned_off)
    assert (model.train_function is None) is turned_off
