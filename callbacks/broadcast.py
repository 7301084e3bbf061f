"""Identical starting weights on every worker, before the first step."""

from __future__ import annotations

import tensorflow as tf

from hvdkeras import basics
from hvdkeras._checks import check_int
from hvdkeras.optimizer import var_id

from ._base import HvdCallback


def model_and_optimizer_variables(model) -> list:
    """Every model and optimizer variable, building the optimizer first if Keras has not yet."""
    optimizer = getattr(model, "optimizer", None)
    variables = list(model.variables)
    if optimizer is not None:
        if not optimizer.built:
            # Keras 3 builds optimizers lazily inside the first step; build now so its slots exist
            # (and are identical) before that step runs.
            optimizer.build(model.trainable_variables)
        variables += list(optimizer.variables)
    return variables


def broadcast_model(model, root_rank: int = 0, check: bool | None = None, local_variables=None,
                    device: str = "") -> None:
    """Sets all model and optimizer variables on every worker to root_rank's values (after checking that
    every worker built the same model, unless `check` is False), except `local_variables`."""
    local = {var_id(v) for v in local_variables or []}
    variables = [v for v in model_and_optimizer_variables(model) if var_id(v) not in local]
    with tf.device(device):
        basics.broadcast_variables(variables, root_rank=root_rank, check=check)


def broadcast_at_first_step(model, root_rank: int = 0, check: bool | None = None, local_variables=None,
                            device: str = "") -> None:
    """Broadcasts a model that Keras has not built yet, before its first forward pass.

    Keras builds a model without an `Input` (a Sequential of layers, a subclassed model) only when its
    train step is first traced, after `on_train_begin`: until then it has no variables to broadcast, and
    an optimizer built now would be built for none. So the train step is wrapped: at its first trace it
    builds the model, its metrics and the optimizer from the batch's shapes, as Keras itself does under a
    distribution strategy, and broadcasts them eagerly (outside the graph being traced), before the
    original step computes anything. Every worker traces its first step at the same point of `fit`.
    """
    original = model.train_step
    done = []

    def train_step(data):
        if not done:
            done.append(True)
            with tf.init_scope():
                if not model.built or (model.optimizer is not None and not model.optimizer.built):
                    model._symbolic_build(data_batch=data)
                broadcast_model(model, root_rank, check=check, local_variables=local_variables, device=device)
            del model.train_step  # later fits and retraces use Keras's own step again
        return original(data)

    model.train_step = train_step
    model.make_train_function(force=True)


class BroadcastGlobalVariablesCallback(HvdCallback):
    """Broadcasts all model and optimizer variables from `root_rank` at the start of every `fit`.

    Unlike Horovod's Keras callback, which broadcasts after the first batch, this runs in `on_train_begin`,
    after building the optimizer, so the first step already starts from identical weights everywhere. It
    runs again on each later `fit`, which also covers weights loaded on one rank only. A model that Keras
    builds lazily (no `Input`, subclassed) is built and broadcast when its first step is traced, still
    before that step computes anything (see `broadcast_at_first_step`).

    Before broadcasting, the workers compare a digest of their variables' shapes and dtypes, so workers
    that built different models fail at once, naming the first variable that differs.

    Args:
        root_rank: the rank whose variables everyone takes.
        device: the device for the broadcasts ("" lets TensorFlow choose), as in Horovod.
        local_variables: variables that stay as each worker has them (Horovod's local variables, see
            `DistributedOptimizer.register_local_var`).
        check_models: compare the workers' models first (default: True unless HVDKERAS_CHECK_MODELS=0).

    Raises:
        ValueError: root_rank is not an integer >= 0; in `fit`, the workers built different models.

    Example:
        >>> model.fit(ds, callbacks=[hvdkeras.callbacks.BroadcastGlobalVariablesCallback(0)])
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables=None, check_models: bool | None = None):
        super().__init__()
        check_int("root_rank", root_rank, 0)
        self.root_rank = root_rank
        self.device = device
        self.local_variables = list(local_variables or [])
        self.check_models = check_models

    def on_train_begin(self, logs=None):
        broadcast = broadcast_model if self.model.built else broadcast_at_first_step
        broadcast(self.model, self.root_rank, check=self.check_models, local_variables=self.local_variables,
                  device=self.device)
