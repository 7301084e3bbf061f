"""What every hvdkeras callback shares."""

from __future__ import annotations

import keras

from hvdkeras.training import rank_zero
from hvdkeras.training.models import average_model_state, prepare_xla


class HvdCallback(keras.callbacks.Callback):
    """Base of hvdkeras callbacks.

    - `set_model` readies a model with a DistributedOptimizer for XLA before Keras makes its train function
      (Horovod's ops cannot be compiled): XLA kept for the forward and backward pass, or turned off
      (models.prepare_xla); and gives a local SGD or DiLoCo reducer the model's non-trainable state to average
      (models.average_model_state).
    - `set_params` silences the Keras progress bar on every rank but 0: Keras hands one `params` dict to all
      callbacks in list order, and the ProgbarLogger it appends reads `verbose` from it after us.
    """

    def set_model(self, model):
        super().set_model(model)
        prepare_xla(model)  # the xla setting in force, the wrap's where it is installed
        average_model_state(model)

    def set_params(self, params):
        if params and "verbose" in params and not rank_zero.is_rank_zero():
            params["verbose"] = 0
        super().set_params(params)
