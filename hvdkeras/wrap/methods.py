"""`fit`, `evaluate`, `predict` and `train_on_batch` under the wrap."""

from __future__ import annotations

import keras

from hvdkeras import _collectives as C
from hvdkeras import callbacks as hvd_callbacks
from hvdkeras import collectives
from hvdkeras.training import data, rank_zero
from hvdkeras.wrap.compile import distribute_held_optimizers
from hvdkeras.wrap.fit_callbacks import MovingStatistics, Warmup, rank_zero_callbacks, shards_state
from hvdkeras.wrap.inputs import (
    check_fit_inputs,
    is_arrays,
    model_input_ranks,
    shard_for_evaluation,
    sharded_fit_inputs,
)
from hvdkeras.wrap.report import with_report
from hvdkeras.wrap.state import STATE


def fit(original, model, *args, **kwargs):
    opts = STATE.options
    kwargs = named(original, args, kwargs)
    if getattr(model, "_hvdkeras_explicit", False):
        # The script's own data, callbacks and verbosity; only the steps are counted for --report-dir.
        kwargs["callbacks"] = with_report(list(kwargs.get("callbacks") or []))
        return original(model, **kwargs)
    distribute_held_optimizers(model)
    # The script's own dataset, before arrays become one here: a guess that warns, never refuses.
    data.check_batched(kwargs.get("x"), model_input_ranks(model))
    if not opts.no_shard:
        kwargs = sharded_fit_inputs(kwargs, opts.batch)
    check_fit_inputs(model, kwargs)
    callbacks = rank_zero_callbacks(list(kwargs.get("callbacks") or []), shards_state(model))
    ours = [hvd_callbacks.BroadcastGlobalVariablesCallback(0), hvd_callbacks.MetricAverageCallback(),
            MovingStatistics()]
    warm_lr = getattr(model, "_hvdkeras_warmup_lr", None)
    if warm_lr is not None and C.size() > 1:
        ours.append(Warmup(warm_lr, warmup_epochs=opts.warmup_epochs))
    # Ours first: their results (global metrics, identical weights) are what the script's callbacks see.
    kwargs["callbacks"] = with_report(ours + callbacks)
    if not rank_zero.is_rank_zero():
        kwargs["verbose"] = 0
    return original(model, **kwargs)


def train_on_batch(original, model, *args, **kwargs):
    """A loop of `train_on_batch` calls has none of fit's callbacks: rank 0's weights are broadcast once, before
    the first update where the model is built, else right after the first batch built it (with the optimizer's
    state, which that batch made); the compiled DistributedOptimizer averages every batch's gradients."""
    if getattr(model, "_hvdkeras_batches_synced", False) or C.size() == 1:
        return original(model, *args, **kwargs)
    before = bool(model.built and model.variables)
    if before:
        collectives.broadcast_variables(model.variables, root_rank=0)
    result = original(model, *args, **kwargs)
    if not before:
        collectives.broadcast_variables([*model.variables, *model.optimizer.variables], root_rank=0)
    model._hvdkeras_batches_synced = True
    return result


def evaluate(original, model, *args, **kwargs):
    opts = STATE.options
    kwargs = named(original, args, kwargs)
    if isinstance(kwargs.get("callbacks"), keras.callbacks.CallbackList) or kwargs.get("_use_cached_eval_dataset"):
        # fit's own validation pass: its data and callbacks were prepared by our fit already.
        return original(model, **kwargs)
    if not opts.no_shard:
        x, y, sw = kwargs.get("x"), kwargs.get("y"), kwargs.get("sample_weight")
        if is_arrays((x, y, sw)):
            kwargs["x"], kwargs["y"], kwargs["sample_weight"] = shard_for_evaluation((x, y, sw))
        else:
            kwargs["x"] = shard_for_evaluation(x)
    kwargs["callbacks"] = [hvd_callbacks.MetricAverageCallback()] + rank_zero_callbacks(
        list(kwargs.get("callbacks") or []))
    if not rank_zero.is_rank_zero():
        kwargs["verbose"] = 0
    return original(model, **kwargs)


def predict(original, model, *args, **kwargs):
    """Every worker predicts all of its input, since the script uses the predictions; only rank 0 shows the
    progress."""
    kwargs = named(original, args, kwargs)
    if not rank_zero.is_rank_zero():
        kwargs["verbose"] = 0
    return original(model, **kwargs)


def named(original, args: tuple, kwargs: dict) -> dict:
    """Positional arguments of fit/evaluate turned into keywords (after `self`)."""
    import inspect

    names = [p for p in inspect.signature(original).parameters if p != "self"]
    named = dict(zip(names, args))
    overlap = set(named) & set(kwargs)
    if overlap:
        raise TypeError(f"got multiple values for argument(s) {sorted(overlap)}")
    named.update(kwargs)
    return named
