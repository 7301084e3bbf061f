"""Identical starting weights on every worker, before the first step."""

from __future__ import annotations

import logging

import keras
import tensorflow as tf

from hvdkeras import collectives, settings
from hvdkeras._checks import check_int
from hvdkeras.training.models import held_optimizers
from hvdkeras.training.optimizer import DistributedOptimizer
from hvdkeras.variables import var_id

from ._base import HvdCallback

log = logging.getLogger("hvdkeras")


def model_and_optimizer_variables(model) -> list:
    """Every model variable, then the variables of every optimizer the model holds (`held_optimizers`),
    building an optimizer first if Keras has not yet."""
    variables = list(model.variables)
    for optimizer in held_optimizers(model).values():
        if not optimizer.built:
            # Keras 3 builds optimizers lazily inside the first step; build now so its slots exist
            # (and are identical) before that step runs.
            optimizer.build(model.trainable_variables)
        # A sharded optimizer's slots are each worker's own part of the state, not copies of one another.
        own = {id(v) for v in getattr(optimizer, "shard_variables", list)()}
        variables += [v for v in optimizer.variables if id(v) not in own]
    return variables


def broadcast_model(model, root_rank: int = 0, check: bool | None = None, local_variables=None,
                    device: str = "") -> None:
    """Sets all model and optimizer variables on every worker to root_rank's values (after checking that
    every worker built the same model, unless `check` is False), except `local_variables`."""
    local = {var_id(v) for v in local_variables or []}
    variables = [v for v in model_and_optimizer_variables(model) if var_id(v) not in local]
    with tf.device(device):
        collectives.broadcast_variables(variables, root_rank=root_rank, check=check)


def _overrides(model, method: str) -> bool:
    return getattr(type(model), method) is not getattr(keras.Model, method)


def builds_at_first_step(model) -> bool:
    """Whether some of the model's variables may appear only when its first train step is traced: a model
    Keras has not built (no `Input`, subclassed, no `call()`), or one with its own `train_step`, which may
    create variables, sub-models and optimizer slots of its own."""
    return not model.built or _overrides(model, "train_step")


def _tensor_spec(value):
    return tf.type_spec_from_value(value) if tf.is_tensor(value) else value


def create_step_variables(model, train_step, data) -> None:
    """Creates every variable the first `train_step(data)` creates, without running a step.

    A model with Keras's own train step is built as Keras itself builds it under a distribution strategy
    (`_symbolic_build`). A custom `train_step` is traced once into a graph that is never run: tracing builds
    the sub-models it calls, the optimizers it applies (their slots) and the metrics it updates, and
    updates nothing. The variables themselves are created outside any graph, as Keras creates them. A
    built model whose step cannot be traced (it needs eager values) keeps the variables it has.

    Raises:
        RuntimeError: a model that is not built cannot be built from a batch, naming the model and what to do.
    """
    custom = _overrides(model, "train_step")
    try:
        if custom:
            # Not under init_scope, which pauses gradient tapes: the traced step takes gradients. Without
            # AutoGraph, as Keras traces a train step (its step function is `do_not_convert`): converting the
            # step and everything it calls took about 70% of this trace, and a step Keras can trace traces here.
            tf.function(train_step, autograph=False).get_concrete_function(tf.nest.map_structure(_tensor_spec, data))
        elif not model.built or (model.optimizer is not None and not model.optimizer.built):
            with tf.init_scope():
                model._symbolic_build(data_batch=data)
    except Exception as err:  # noqa: BLE001 - re-raised with what to do, the cause attached
        if custom and model.built:
            log.info("hvdkeras: the train_step of model %r cannot be traced ahead of its first step (%s: %s); "
                     "broadcasting the variables it has", model.name, type(err).__name__, err)
            return
        raise RuntimeError(
            f"hvdkeras could not create the variables of model {model.name!r} ({type(model).__name__}) before "
            "its first step, so they cannot be made identical on every worker before the first update. "
            f"{'Tracing its train_step' if custom else 'Building it from a batch'} raised "
            f"{type(err).__name__}: {err}. Build the model before fit by calling it on a batch (model(x[:1]))."
        ) from err


def broadcast_at_first_step(model, root_rank: int = 0, check: bool | None = None, local_variables=None,
                            device: str = "") -> None:
    """Broadcasts a model whose variables are not all there yet, before its first step computes anything.

    Keras builds a model without an `Input` (a Sequential of layers, a subclassed model) only when its
    train step is first traced, after `on_train_begin`, and a custom `train_step` may create variables
    (sub-models, optimizer slots, trackers) of its own. So the train step is wrapped: at its first trace it
    creates every variable from the batch's shapes (`create_step_variables`) and broadcasts them eagerly
    (outside the graph being traced), before the original step computes anything. Every worker traces its
    first step at the same point of `fit`.
    """
    _remove_first_step(model)  # a fit that failed in its first step left ours behind
    original = model.train_step
    done = []

    def train_step(data):
        if not done:
            done.append(True)
            try:
                create_step_variables(model, original, data)
                with tf.init_scope():
                    broadcast_model(model, root_rank, check=check, local_variables=local_variables,
                                    device=device)
            finally:
                _remove_first_step(model)  # later fits and retraces use the model's own step
        return original(data)

    train_step._hvdkeras_first_step = True
    model.train_step = train_step
    model.make_train_function(force=True)


def _remove_first_step(model) -> None:
    if getattr(model.__dict__.get("train_step"), "_hvdkeras_first_step", False):
        del model.__dict__["train_step"]


def _undistributed(model) -> list[str]:
    return [f"{name} ({type(opt).__name__})" for name, opt in held_optimizers(model).items()
            if not isinstance(opt, DistributedOptimizer)]


class BroadcastGlobalVariablesCallback(HvdCallback):
    """Broadcasts all model and optimizer variables from `root_rank` at the start of every `fit`.

    Unlike Horovod's Keras callback, which broadcasts after the first batch, this runs in `on_train_begin`,
    after building the optimizer, so the first step already starts from identical weights everywhere. It
    runs again on each later `fit`, which also covers weights loaded on one rank only. A model that Keras
    builds lazily (no `Input`, subclassed, no `call()`) or that has its own `train_step` is built and
    broadcast when its first step is traced, still before that step computes anything (see
    `broadcast_at_first_step`). The optimizers are all those the model holds (`held_optimizers`: a GAN's
    two as well as `model.optimizer`).

    Before broadcasting, the workers compare a digest of their variables' shapes and dtypes, so workers
    that built different models fail at once, naming the first variable that differs. After every epoch
    they compare a checksum of each trainable weight, so workers that stopped training one model (some
    gradients applied without being averaged, say by an optimizer that is not a DistributedOptimizer)
    fail at that epoch, naming the first weight that differs and the optimizers to wrap.

    Args:
        root_rank: the rank whose variables everyone takes.
        device: the device for the broadcasts ("" lets TensorFlow choose), as in Horovod.
        local_variables: variables that stay as each worker has them (Horovod's local variables, see
            `DistributedOptimizer.register_local_var`); neither broadcast nor compared.
        check_models: run both checks (default: True unless HVDKERAS_CHECK_MODELS=0).

    Raises:
        ValueError: root_rank is not an integer >= 0; in `fit`, the workers built different models.
        RuntimeError: in `fit`, the model cannot be built before its first step, or the workers' trainable
            weights differ after an epoch.

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

    def _checking(self) -> bool:
        if self.check_models is None:
            return settings.current().check_models
        return bool(self.check_models)

    def on_train_begin(self, logs=None):
        broadcast = broadcast_at_first_step if builds_at_first_step(self.model) else broadcast_model
        broadcast(self.model, self.root_rank, check=self.check_models, local_variables=self.local_variables,
                  device=self.device)

    def on_epoch_end(self, epoch, logs=None):
        if not self._checking():
            return
        local = {var_id(v) for v in self.local_variables}
        optimizer = getattr(self.model, "optimizer", None)
        if isinstance(optimizer, DistributedOptimizer):
            local |= optimizer._local_ids()
        undistributed = _undistributed(self.model)
        hint = (f"The model holds optimizers that are not DistributedOptimizers: {', '.join(undistributed)}; "
                "wrap each in hvdkeras.DistributedOptimizer. " if undistributed else
                "Were some gradients applied outside a DistributedOptimizer? Pass per-worker variables as "
                "local_variables. ")
        collectives.check_in_sync([v for v in self.model.trainable_variables if var_id(v) not in local],
                                  when=f"after epoch {epoch + 1}", hint=hint)
