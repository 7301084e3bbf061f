"""What every hvdkeras callback shares."""

from __future__ import annotations

import keras

from hvdkeras import rank_zero
from hvdkeras.models import ensure_not_jit_compiled


class HvdCallback(keras.callbacks.Callback):
    """Base of hvdkeras callbacks.

    - `set_model` turns XLA off for a model with a DistributedOptimizer (Horovod's ops cannot be compiled),
      before Keras makes its train function.
    - `set_params` silences the Keras progress bar on every rank but 0: Keras hands one `params` dict to all
      callbacks in list order, and the ProgbarLogger it appends reads `verbose` from it after us.
    """

    def set_model(self, model):
        super().set_model(model)
        ensure_not_jit_compiled(model)

    def set_params(self, params):
        if params and "verbose" in params and not rank_zero.is_rank_zero():
            params["verbose"] = 0
        super().set_params(params)
