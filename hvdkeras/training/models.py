"""What hvdkeras needs to know about a Keras model: the optimizers it holds, readying it for XLA, and its state a
periodic reducer averages."""

from __future__ import annotations

import logging
from typing import Any

import keras

from hvdkeras import settings
from hvdkeras.reduce.periodic import PeriodicReducer
from hvdkeras.training import xla
from hvdkeras.training.optimizer import DistributedOptimizer

log = logging.getLogger("hvdkeras")


def held_optimizers(model: Any) -> dict[str, Any]:
    """The optimizers a model holds, by attribute: `optimizer` (what `compile` got) first, then any other
    attribute holding one, such as a GAN's `d_optimizer` and `g_optimizer` that its own `compile` keeps."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    candidates = [("optimizer", getattr(model, "optimizer", None)), *sorted(vars(model).items(), key=lambda kv: kv[0])]
    for name, value in candidates:
        if isinstance(value, keras.optimizers.Optimizer) and id(value) not in seen:
            seen.add(id(value))
            found[name] = value
    return found


def sharded_optimizers(model: Any) -> dict[str, Any]:
    """The model's optimizers whose state is sharded across the workers (shard_optimizer_state=True, built), by
    the attribute that holds each (as `held_optimizers`)."""
    return {name: o for name, o in held_optimizers(model).items() if isinstance(o, DistributedOptimizer) and o.sharded}


def collective_optimizers(model: Any) -> dict[str, Any]:
    """The model's optimizers whose checkpoints need every worker (`DistributedOptimizer.saves_collectively`: a
    sharded state, or a reducer's state of each worker's own), by attribute (as `held_optimizers`)."""
    return {name: o for name, o in held_optimizers(model).items()
            if isinstance(o, DistributedOptimizer) and o.saves_collectively}


def consolidate_optimizer_state(model: Any) -> None:
    """Gathers each sharded optimizer's full state, and each worker's own reducer state, on every worker, so that
    rank 0 alone can save the model next. Collective: every worker calls it (a no-op for a model without such
    an optimizer)."""
    for optimizer in collective_optimizers(model).values():
        optimizer.consolidate_state()


def average_model_state(model: Any) -> None:
    """Gives each of the model's optimizers whose reducer synchronises periodically (local SGD, DiLoCo) the model's
    non-trainable variables (BatchNormalization's moving statistics), averaged at every synchronisation
    (`PeriodicReducer.average_also`). Callbacks do it in `set_model`, the wrap in `compile`."""
    for optimizer in held_optimizers(model).values():
        reducer = getattr(optimizer, "reducer", None) if isinstance(optimizer, DistributedOptimizer) else None
        if isinstance(reducer, PeriodicReducer) and not reducer.averages_extra:
            reducer.average_also(lambda: model.non_trainable_variables)


_xla_warned = False
# The xla setting in force: the wrap's `Options.xla` while the wrap is installed (it sets it), else HVDKERAS_XLA.
_xla_setting: str | None = None


def use_xla_setting(value: str | None) -> None:
    """Makes `value` ("keep" or "off") the xla setting that the wrap and the callbacks both follow; None makes
    HVDKERAS_XLA the setting again. Called by the wrap's install (its option) and uninstall (None)."""
    global _xla_setting
    _xla_setting = value


def xla_setting() -> str:
    """The xla setting in force: "keep" or "off" (see `use_xla_setting`)."""
    return _xla_setting if _xla_setting is not None else settings.current().xla


def prepare_xla(model: Any, keep: bool | None = None) -> str:
    """Readies a model with a distributed optimizer for XLA, before its train function is made (callbacks do
    it in `set_model`, the wrap in `compile`). Horovod's collectives cannot be compiled by XLA.

    With `keep` and a model that trains with Keras's own train step, XLA stays on for the forward and
    backward pass, and the gradients are reduced outside (hvdkeras.training.xla). Otherwise XLA is turned off for
    the model, with a warning (once) that says why. `keep` None (as the wrap and the callbacks call it): the
    xla setting in force (`xla_setting()`) is "keep".

    Returns:
        "kept", "off" (turned off here), or "" (no distributed optimizer, or XLA was not on).
    """
    global _xla_warned
    if keep is None:
        keep = xla_setting() == "keep"
    if not any(isinstance(o, DistributedOptimizer) for o in held_optimizers(model).values()):
        return ""
    if not getattr(model, "jit_compile", False):
        return ""
    if keep and xla.keep_xla(model):
        return "kept"
    why = xla.why_not(model) if keep else "--xla off (HVDKERAS_XLA=off) asks for it"
    model.jit_compile = False
    for attr in ("train_function", "test_function", "predict_function"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)
    if not _xla_warned:
        _xla_warned = True
        log.warning(
            "hvdkeras: XLA (jit_compile) turned off for model %r: Horovod's collectives cannot be compiled by "
            "XLA, and %s. Compile with jit_compile=False to silence this warning.",
            getattr(model, "name", model), why,
        )
    return "off"
