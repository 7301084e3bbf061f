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


def broadcast_model(model, root_rank: int = 0, check: bool | None = None) -> None:
    """Sets all model and optimizer variables on every worker to root_rank's values (after checking that
    every worker built the same model, unless `check` is False)."""
    basics.broadcast_variables(model_and_optimizer_variables(model), root_rank=root_rank, check=check)


class BroadcastGlobalVariablesCallback(HvdCallback):
    """Broadcasts all model and optimizer variables from `root_rank` at the start of every `fit`.

    Unlike Horovod's Keras callback, which broadcasts after the first batch, this runs in `on_train_begin`,
    after building the optimizer, so the first step already starts from identical weights everywhere. It
    runs again on each later `fit`, which also covers weights loaded on one rank only.

    Before broadcasting, the workers compare a digest of their variables' shapes and dtypes, so workers
    that built different models fail at once, naming the first variable that differs.

    Args:
        root_rank: the rank whose variables everyone takes.
        check_models: compare the workers' models first (default: True unless HVDKERAS_CHECK_MODELS=0).

    Raises:
        ValueError: root_rank is not an integer >= 0; in `fit`, the workers built different models.

    Example:
        >>> model.fit(ds, callbacks=[hvdkeras.callbacks.BroadcastGlobalVariablesCallback(0)])
    """

    def __init__(self, root_rank: int = 0, check_models: bool | None = None):
        super().__init__()
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or root_rank < 0:
            raise ValueError(f"`root_rank` must be an integer >= 0. Received: root_rank={root_rank!r}")
        self.root_rank = root_rank
        self.check_models = check_models

    def on_train_begin(self, logs=None):
        broadcast_model(self.model, self.root_rank, check=self.check_models)
