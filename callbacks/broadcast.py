"""Identical starting weights on every worker, before the first step."""

from __future__ import annotations

from hvdkeras import basics

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


def broadcast_model(model, root_rank: int = 0) -> None:
    """Sets all model and optimizer variables on every worker to root_rank's values."""
    basics.broadcast_variables(model_and_optimizer_variables(model), root_rank=root_rank)


class BroadcastGlobalVariablesCallback(HvdCallback):
    """Broadcasts all model and optimizer variables from `root_rank` at the start of every `fit`.

    Unlike Horovod's Keras callback, which broadcasts after the first batch, this runs in `on_train_begin`,
    after building the optimizer, so the first step already starts from identical weights everywhere. It
    runs again on each later `fit`, which also covers weights loaded on one rank only.

    Args:
        root_rank: the rank whose variables everyone takes.

    Raises:
        ValueError: root_rank is not an integer >= 0.

    Example:
        >>> model.fit(ds, callbacks=[hvdkeras.callbacks.BroadcastGlobalVariablesCallback(0)])
    """

    def __init__(self, root_rank: int = 0):
        super().__init__()
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or root_rank < 0:
            raise ValueError(f"`root_rank` must be an integer >= 0. Received: root_rank={root_rank!r}")
        self.root_rank = root_rank

    def on_train_begin(self, logs=None):
        broadcast_model(self.model, self.root_rank)
