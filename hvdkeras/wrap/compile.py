"""`compile` and `compile_from_config` under the wrap: the script's optimizer scaled and distributed, XLA readied."""

from __future__ import annotations

import logging

import keras

from hvdkeras.compression import Compression
from hvdkeras.reduce import from_spec
from hvdkeras.training import rank_zero
from hvdkeras.training.learning_rate import as_float, scale_factor, scale_learning_rate
from hvdkeras.training.models import average_model_state, held_optimizers, prepare_xla
from hvdkeras.training.optimizer import DistributedOptimizer, unwrap
from hvdkeras.wrap.state import STATE, warn_once

log = logging.getLogger("hvdkeras")


def compile_model(original, model, optimizer="rmsprop", *args, **kwargs):
    # A script that compiles with a DistributedOptimizer uses hvdkeras's API itself: it shards its data,
    # adds its callbacks and gates its own writes (often `if hvd.rank() == 0: model.save(...)`, where a
    # wrapped save would wait for ranks that never call it). Its optimizer is left as the script made it;
    # only XLA is readied below, as for every model, so that --xla applies to it too.
    model._hvdkeras_explicit = isinstance(optimizer, DistributedOptimizer)
    if optimizer is not None and not model._hvdkeras_explicit:
        # A model being loaded keeps the learning rate it was saved with, as hvdkeras.load_model does.
        optimizer, model._hvdkeras_warmup_lr = distributed(model, optimizer, scale=not STATE.loading,
                                                           loss_scale=kwargs.get("auto_scale_loss", True))
    result = original(model, optimizer, *args, **kwargs)
    if optimizer is not None:
        prepare_xla(model)  # the xla setting in force: this wrap's option (install)
        average_model_state(model)
    return result


def distributed(model, optimizer, scale: bool = True, loss_scale: bool = True):
    """The script's optimizer (an instance, a string or a config) scaled by the lr rule and wrapped in a
    DistributedOptimizer; also returns the scaled rate when a float rate was scaled (warm-up's target)."""
    opts = STATE.options
    optimizer = keras.optimizers.get(optimizer)
    base = unwrap(optimizer)
    current = base._learning_rate
    scaled = None
    if scale and scale_factor(opts.scaling_rule) != 1.0:
        if isinstance(current, keras.optimizers.schedules.LearningRateSchedule):
            base.learning_rate = scale_learning_rate(current, opts.scaling_rule)
        elif callable(current) and not isinstance(current, keras.Variable):
            warn_once("lr-callable", "the learning rate is a callable: it is not scaled with the world size")
        else:
            base.learning_rate = scale_learning_rate(as_float(base.learning_rate), opts.scaling_rule)
            scaled = as_float(base.learning_rate)
    mixed = model.dtype_policy.name == "mixed_float16" and loss_scale
    if mixed and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        # What compile would do, but inside the DistributedOptimizer: the finiteness check must see
        # the reduced gradients.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer = DistributedOptimizer(
        optimizer,
        compression=Compression.fp16 if opts.fp16_allreduce else Compression.none,
        backward_passes_per_step=opts.backward_passes_per_step,
        # --backward-passes-per-step K: K batches make one step on a K times larger batch.
        average_aggregated_gradients=True,
        shard_optimizer_state=opts.shard_optimizer_state,
        reducer=None if opts.shard_optimizer_state else from_spec(opts.reducer),
    )
    return optimizer, scaled


def compile_from_config(original, model, config):
    """`load_model` compiles the model it loads through here: its saved rate is not scaled again."""
    STATE.loading += 1
    try:
        return original(model, config)
    finally:
        STATE.loading -= 1


def distribute_held_optimizers(model) -> None:
    """Wraps the optimizers a model keeps besides `model.optimizer` (a GAN's own `compile(d_optimizer,
    g_optimizer)`): its train_step applies them, so they must average the workers' gradients too."""
    for name, optimizer in held_optimizers(model).items():
        if name != "optimizer" and not isinstance(optimizer, DistributedOptimizer):
            setattr(model, name, distributed(model, optimizer)[0])
            if rank_zero.is_rank_zero():
                log.info("hvdkeras: model %r holds optimizer %r: wrapped in a DistributedOptimizer", model.name, name)
