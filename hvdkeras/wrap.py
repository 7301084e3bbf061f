"""Patches that make an unmodified Keras 3 script data-parallel (`python -m hvdkeras script.py`).

`install(options)` changes `keras.Model` (on the classes that define the methods) for this process only:
- `compile`: the optimizer (instance, string or config dict) is scaled by the lr rule and wrapped in a
  DistributedOptimizer (inside a LossScaleOptimizer's place under mixed_float16); XLA is kept for the forward
  and backward pass only, or turned off for a model with its own train step (models.prepare_xla).
  `compile_from_config` (what `load_model` calls) compiles the same way without scaling the saved rate.
- `fit` / `evaluate`: datasets, arrays, dicts of arrays, PyDatasets, `validation_split` and
  `validation_data` are sharded with equal steps; the optimizers a model holds besides `model.optimizer`
  are wrapped too; broadcast, exact-metric, moving-statistics (and warm-up) callbacks are added; progress
  on rank 0 only; ModelCheckpoint / TensorBoard / CSVLogger / BackupAndRestore act on rank 0 only.
- The learning rate: warm-up until the script sets the rate itself, which then keeps it (`_Warmup`).
- `train_on_batch`: rank 0's weights are broadcast before the first update (no fit callbacks run there).
- `predict`: progress on rank 0 only (every rank predicts all of its input).
- `save`, `save_weights`, `export`: rank 0 writes (atomically), the others wait for it.
A model that the script compiles with a DistributedOptimizer itself is left as the script made it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import os
import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import callbacks as hvd_callbacks
from hvdkeras import (
    collectives,
    data,
    keras_output,
    loops,
    patches,
    rank_zero,
    saving,
    script_writes,
    settings,
    strategy,
    sync_batch_norm,
)
from hvdkeras.compression import Compression
from hvdkeras.learning_rate import as_float, scale_factor, scale_learning_rate
from hvdkeras.models import (
    average_model_state,
    consolidate_optimizer_state,
    held_optimizers,
    prepare_xla,
    sharded_optimizers,
    use_xla_setting,
)
from hvdkeras.optimizer import DistributedOptimizer, unwrap
from hvdkeras.reduce import from_spec
from hvdkeras.reduce.options import ReductionOptions

log = logging.getLogger("hvdkeras")

class _OptionsChecks:
    def __post_init__(self):
        for field in dataclasses.fields(self):
            settings.check_value(field.name, getattr(self, field.name))
        settings.check_reducer_with_sharding(self.reducer, self.shard_optimizer_state)

    @property
    def scaling_rule(self) -> str:
        """The learning-rate rule in force: `lr_scaling` where given, else the batch convention's."""
        if self.lr_scaling is not None:
            return self.lr_scaling
        return "linear" if self.batch == "per-worker" else "none"


Options = dataclasses.make_dataclass(
    "Options", [(f.name, f.type, dataclasses.field(default=f.default)) for f in settings.training_settings()],
    bases=(_OptionsChecks,), frozen=True)
Options.__module__ = __name__
Options.__doc__ = """What `python -m hvdkeras` / `hvdkeras run` change in the script's training: one field per training
setting of `hvdkeras.settings` (its table says what each does), with its default, checked when made.

    batch: what a batch in the script is. "global" (Keras's convention, as in tf.distribute): each batch is
        split over the workers and the learning rate is left as the script set it; "per-worker": each worker
        trains on whole batches, so the global batch is N times the script's, and the rate is scaled.
    lr_scaling: "linear", "sqrt" or "none"; None (the default) follows `batch`: "linear" for "per-worker",
        "none" for "global".

Raises:
    ValueError: a field's value is not what its setting takes, naming it and what was received.
"""


def options_from_env(environ: dict | None = None) -> dict:
    """The training options given as HVDKERAS_* environment variables, for launchers that cannot pass flags."""
    given = settings.given(os.environ if environ is None else environ)
    return {field.name: given[field.name] for field in settings.training_settings() if field.name in given}


_state: dict[str, Any] = {"options": None, "warned": set(), "fits": [], "loading": 0}


def _warn_once(key: str, message: str) -> None:
    if key not in _state["warned"]:
        _state["warned"].add(key)
        if rank_zero.is_rank_zero():
            warnings.warn(f"hvdkeras: {message}", stacklevel=3)


def installed() -> bool:
    return patches.installed("wrap")


def install(options: Options | None = None) -> None:
    """Makes `keras.Model` data-parallel in this process (the "wrap" patch; `uninstall` undoes it).

    Installing again only replaces the options.
    """
    _state["options"] = options or Options()
    use_xla_setting(_opts().xla)  # what the callbacks follow too
    replacements = (("compile", _compile), ("compile_from_config", _compile_from_config), ("fit", _fit),
                    ("train_on_batch", _train_on_batch), ("evaluate", _evaluate), ("predict", _predict),
                    ("save", _write_on_rank_zero),
                    ("save_weights", _write_on_rank_zero), ("export", _export))
    patches.install("wrap", [(_owner(name), name, _bind(getattr(keras.Model, name), replacement))
                             for name, replacement in replacements])
    keras_output.install()
    strategy.install()
    loops.install(ReductionOptions(compression=Compression.fp16 if _opts().fp16_allreduce else Compression.none),
                  batch=None if _opts().no_shard else _opts().batch, reducer=_opts().reducer)
    script_writes.install(job_start=_job_start())


def _owner(name: str) -> type:
    """The class in keras.Model's MRO that defines `name`, where the patch goes.

    Keras compares `type(model).compile` with its trainer's own `compile` to tell a model class that
    overrides it (and `compile_from_config`, used by `load_model`, then skips compiling): a patch on the
    defining class keeps that comparison true for every class that does not override it.
    """
    return next(cls for cls in keras.Model.__mro__ if name in vars(cls))


def _bind(original, replacement):
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        if getattr(self, "_hvdkeras_explicit", False) and replacement not in (_compile, _compile_from_config, _fit):
            return original(self, *args, **kwargs)
        return replacement(original, self, *args, **kwargs)

    return method


def uninstall() -> None:
    patches.uninstall("wrap")
    keras_output.uninstall()
    strategy.uninstall()
    loops.uninstall()
    script_writes.uninstall()
    _state["options"] = None
    use_xla_setting(None)


def _job_start() -> float:
    """When the job started, for the folders this job made: this process's start. Every rank's process starts
    before any rank runs the script, since `init()` forms the job from all of them first; no collective here,
    so a worker that joins an elastic job later installs the wrap alone."""
    import psutil

    return psutil.Process().create_time()


def _opts() -> Options:
    return _state["options"]


# ---------------------------------------------------------------------------------------------- compile
def _compile(original, model, optimizer="rmsprop", *args, **kwargs):
    # A script that compiles with a DistributedOptimizer uses hvdkeras's API itself: it shards its data,
    # adds its callbacks and gates its own writes (often `if hvd.rank() == 0: model.save(...)`, where a
    # wrapped save would wait for ranks that never call it). Its optimizer is left as the script made it;
    # only XLA is readied below, as for every model, so that --xla applies to it too.
    model._hvdkeras_explicit = isinstance(optimizer, DistributedOptimizer)
    if optimizer is not None and not model._hvdkeras_explicit:
        # A model being loaded keeps the learning rate it was saved with, as hvdkeras.load_model does.
        optimizer, model._hvdkeras_warmup_lr = _distributed(model, optimizer, scale=not _state["loading"],
                                                            loss_scale=kwargs.get("auto_scale_loss", True))
    result = original(model, optimizer, *args, **kwargs)
    if optimizer is not None:
        prepare_xla(model)  # the xla setting in force: this wrap's option (install)
        average_model_state(model)
    return result


def _distributed(model, optimizer, scale: bool = True, loss_scale: bool = True):
    """The script's optimizer (an instance, a string or a config) scaled by the lr rule and wrapped in a
    DistributedOptimizer; also returns the scaled rate when a float rate was scaled (warm-up's target)."""
    opts = _opts()
    optimizer = keras.optimizers.get(optimizer)
    base = unwrap(optimizer)
    current = base._learning_rate
    scaled = None
    if scale and scale_factor(opts.scaling_rule) != 1.0:
        if isinstance(current, keras.optimizers.schedules.LearningRateSchedule):
            base.learning_rate = scale_learning_rate(current, opts.scaling_rule)
        elif callable(current) and not isinstance(current, keras.Variable):
            _warn_once("lr-callable", "the learning rate is a callable: it is not scaled with the world size")
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


def _compile_from_config(original, model, config):
    """`load_model` compiles the model it loads through here: its saved rate is not scaled again."""
    _state["loading"] += 1
    try:
        return original(model, config)
    finally:
        _state["loading"] -= 1


def _distribute_held_optimizers(model) -> None:
    """Wraps the optimizers a model keeps besides `model.optimizer` (a GAN's own `compile(d_optimizer,
    g_optimizer)`): its train_step applies them, so they must average the workers' gradients too."""
    for name, optimizer in held_optimizers(model).items():
        if name != "optimizer" and not isinstance(optimizer, DistributedOptimizer):
            setattr(model, name, _distributed(model, optimizer)[0])
            if rank_zero.is_rank_zero():
                log.info("hvdkeras: model %r holds optimizer %r: wrapped in a DistributedOptimizer", model.name, name)


# ------------------------------------------------------------------------------------------ fit / evaluate
def _is_arrays(value: Any) -> bool:
    leaves = [v for v in keras.tree.flatten(value) if v is not None]
    return bool(leaves) and all(isinstance(v, np.ndarray) or tf.is_tensor(v) for v in leaves)


def _shard_for_training(x, y, sw):
    """Equal steps on every worker: datasets through data.shard, arrays through data.shard_arrays."""
    if _is_arrays((x, y, sw)):
        return data.shard_arrays((x, y, sw))
    if isinstance(x, tf.data.Dataset) and x.cardinality() != tf.data.INFINITE_CARDINALITY:
        return data.shard(x), y, sw
    if _is_py_dataset(x):
        return data.shard_py_dataset(x), y, sw
    _unshardable(x, "x")
    return x, y, sw


def _is_py_dataset(value: Any) -> bool:
    return isinstance(value, keras.utils.PyDataset) and value.num_batches is not None


def _shard_for_evaluation(value: Any) -> Any:
    """Evaluation has no per-step collectives: shard without dropping anything, so the metrics are exact."""
    if isinstance(value, tf.data.Dataset):
        if value.cardinality() == tf.data.INFINITE_CARDINALITY:
            _unshardable(value, "an infinite evaluation dataset")
            return value
        return value.shard(C.size(), C.rank())
    if _is_arrays(value):
        return data.shard_arrays(value, equal=False)
    if _is_py_dataset(value):
        return data.shard_py_dataset(value, equal=False)
    _unshardable(value, "validation data")
    return value


def _unshardable(value: Any, what: str) -> None:
    if value is not None:
        _warn_once(f"shard-{what}-{type(value).__name__}",
                   f"{what} of type {type(value).__name__} cannot be sharded: every worker reads all of it "
                   "(shard it in the script and run with --no-shard)")


def _sharded_fit_inputs(kwargs: dict, batch: str) -> dict:
    """fit's training and validation data for this worker, under the batch convention `batch`."""
    x, y, sw = kwargs.get("x"), kwargs.get("y"), kwargs.get("sample_weight")
    validation = kwargs.get("validation_data")
    split = kwargs.get("validation_split") or 0.0
    if split and validation is None and _is_arrays((x, y, sw)):
        # Split the whole arrays the way Keras does (the last fraction), then shard both parts, so the
        # workers' validation sets together are the single-worker validation set.
        n = int(np.shape(keras.tree.flatten(x)[0])[0])
        cut = int(np.floor(n * (1.0 - split)))
        vx, vy, vsw = keras.tree.map_structure(lambda a: None if a is None else a[cut:], (x, y, sw))
        x, y, sw = keras.tree.map_structure(lambda a: None if a is None else a[:cut], (x, y, sw))
        validation = (vx, vy) if vsw is None else (vx, vy, vsw)
        kwargs["validation_split"] = 0.0
    if batch == "global":
        kwargs.update(_split_global_batches(x, y, sw, kwargs))
    else:
        kwargs["x"], kwargs["y"], kwargs["sample_weight"] = _shard_for_training(x, y, sw)
    if validation is not None:
        kwargs["validation_data"] = _shard_for_evaluation(validation)
    return kwargs


def _split_global_batches(x, y, sw, kwargs: dict) -> dict:
    """Keras's convention: each batch fit makes of the data is a global batch, and this worker trains on its
    rows of it (data.split_batches). Arrays become the very batches Keras would make of them in one process
    (its own array adapter: the same shuffling, class weights and batch size), split."""
    if _is_arrays((x, y, sw)):
        batches, batch_size = _global_array_batches(x, y, sw, kwargs)
        return {"x": data.split_batches(batches), "y": None, "sample_weight": None, "class_weight": None,
                "batch_size": None, "shuffle": False,
                # Validation arrays keep the script's batch size (fit would take it from batch_size).
                "validation_batch_size": kwargs.get("validation_batch_size") or batch_size}
    if data.splittable(x):
        return {"x": data.split_batches(x)}
    _unshardable(x, "x")
    return {"x": x, "y": y, "sample_weight": sw}


def _global_array_batches(x, y, sw, kwargs: dict) -> tuple[tf.data.Dataset, int]:
    """The global batches of fit's arrays, the same on every worker, and their batch size.

    Keras's own array adapter makes them, so a script seeded alike on every worker (the usual reproducible
    script) trains exactly as in one process. Where the workers' first batches differ (a script that seeds
    nothing, or seeds by rank), Keras's shuffling differs between them, and the batches are made here
    instead: the same rows shuffled with one seed chosen by rank 0, anew every epoch.
    """
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    shuffle = kwargs.get("shuffle", True)
    adapter = ArrayDataAdapter(x, y, sample_weight=sw, class_weight=kwargs.get("class_weight"), shuffle=shuffle,
                               batch_size=kwargs.get("batch_size"), steps=kwargs.get("steps_per_epoch"))
    batches = adapter.get_tf_dataset()
    if shuffle is True and C.size() > 1 and not _same_on_every_worker(next(iter(batches))):
        n = int(np.shape(keras.tree.flatten(x)[0])[0])
        ordered = ArrayDataAdapter(x, y, sample_weight=sw, class_weight=kwargs.get("class_weight"), shuffle=False,
                                   batch_size=n).get_tf_dataset()
        rows = next(iter(ordered))  # every row, in order, with class weights as sample weights
        seed = C.broadcast_object(int(np.random.default_rng().integers(2**31)), root_rank=0,
                                  name="hvdkeras.wrap.shuffle_seed")
        order = tf.data.Dataset.range(n).shuffle(n, seed=seed, reshuffle_each_iteration=True).batch(adapter.batch_size)
        batches = order.map(lambda idx: keras.tree.map_structure(lambda a: tf.gather(a, idx), rows))
        _warn_once("shuffle-seed", "the workers shuffle fit's arrays differently (the script does not seed them "
                                   "alike): hvdkeras shuffles them with one seed on every worker instead")
    if adapter.num_batches is not None:
        # Its cardinality is unknown to tf.data; Keras would take it from the adapter.
        batches = batches.apply(tf.data.experimental.assert_cardinality(adapter.num_batches))
    return batches, adapter.batch_size


def _same_on_every_worker(batch: Any) -> bool:
    digest = weights_digest(keras.tree.flatten(batch))
    return len(set(C.allgather_object(digest, name="hvdkeras.wrap.first_batch"))) == 1


def _shards_state(model: Any) -> bool:
    return any(isinstance(o, DistributedOptimizer) and o.shard_optimizer_state for o in held_optimizers(model).values())


def _as_hvd_checkpoint(cb: keras.callbacks.ModelCheckpoint) -> hvd_callbacks.ModelCheckpoint:
    """The script's ModelCheckpoint, configured as it is, as hvdkeras's: every worker runs its hooks and
    gathers a sharded optimizer's state with the others before rank 0 saves."""
    converted = hvd_callbacks.ModelCheckpoint.__new__(hvd_callbacks.ModelCheckpoint)
    converted.__dict__.update(cb.__dict__)
    return converted


def _rank_zero_callbacks(callbacks: list, sharded: bool = False) -> list:
    out = []
    for cb in callbacks:
        if isinstance(cb, (hvd_callbacks.RankZeroOnly, hvd_callbacks.ModelCheckpoint, hvd_callbacks.TensorBoard,
                           hvd_callbacks.CSVLogger, hvd_callbacks.BackupAndRestore)):
            out.append(cb)
        elif isinstance(cb, keras.callbacks.BackupAndRestore):
            out.append(_as_hvd_backup(cb))
        elif sharded and isinstance(cb, keras.callbacks.ModelCheckpoint):
            out.append(_as_hvd_checkpoint(cb))
        elif isinstance(cb, (keras.callbacks.ModelCheckpoint, keras.callbacks.TensorBoard, keras.callbacks.CSVLogger)):
            out.append(hvd_callbacks.RankZeroOnly(cb, wait=True))
        else:
            out.append(cb)
    return out


def _as_hvd_backup(cb: keras.callbacks.BackupAndRestore) -> hvd_callbacks.BackupAndRestore:
    return hvd_callbacks.BackupAndRestore(cb.backup_dir, save_freq=cb.save_freq,
                                          double_checkpoint=cb.double_checkpoint,
                                          delete_checkpoint=cb.delete_checkpoint)


class _StepCounter(keras.callbacks.Callback):
    """--report-dir only: counts a fit's steps and, at its end, writes the worker's report."""

    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def on_train_end(self, logs=None):
        _state["fits"].append(self.steps)
        _report(self.model)


def _with_report(callbacks: list) -> list:
    """The fit's callbacks, with a step counter last when --report-dir asks for reports."""
    return callbacks + [_StepCounter()] if _opts().report_dir else callbacks


class _MovingStatistics(keras.callbacks.Callback):
    """Averages BatchNormalization's moving statistics across workers before each validation and at the
    end of each epoch, so validation, checkpoints and the saved model use one model's statistics."""

    def on_test_begin(self, logs=None):
        sync_batch_norm.average_moving_statistics(self.model)

    def on_epoch_end(self, epoch, logs=None):
        sync_batch_norm.average_moving_statistics(self.model)


class _Warmup(hvd_callbacks.LearningRateWarmupCallback):
    """The warm-up of a learning rate that hvdkeras scaled, which hands the rate over to the script as soon as
    the script sets it (its own callback, LearningRateScheduler, ReduceLROnPlateau, ...).

    The rate is compared, before every batch, with the last value hvdkeras saw or set: a change it did not
    make is the script's. From then on hvdkeras stops warming up (in this and later fits) and the rate is
    whatever the script sets; a warning says so once.
    """

    def __init__(self, target: float, warmup_epochs: float):
        super().__init__(target, warmup_epochs=warmup_epochs)
        self._seen: float | None = None
        self.handed_over = False

    def _script_set_it(self) -> bool:
        if not self.handed_over and self._seen is not None and self._current_lr() != self._seen:
            self.handed_over = True
            self.model._hvdkeras_warmup_lr = None
            _warn_once("lr-script", f"the script sets the learning rate itself (to {self._current_lr():g}): from "
                                    "now on hvdkeras neither scales nor warms it up, and the rates the script sets "
                                    "are used as they are")
        return self.handed_over

    def _set_lr(self, lr: float) -> None:
        if not self._script_set_it():
            super()._set_lr(lr)
            self._seen = self._current_lr()

    def on_train_begin(self, logs=None):
        self._seen = self._current_lr()

    def on_train_batch_begin(self, batch, logs=None):
        if not self._script_set_it():
            super().on_train_batch_begin(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, None)  # the script's History gets no key of ours
        if epoch >= math.ceil(self.warmup_epochs) - 1:
            self.model._hvdkeras_warmup_lr = None  # warmed up once; later fits start at the scaled rate


def _fit(original, model, *args, **kwargs):
    opts = _opts()
    kwargs = _named(original, args, kwargs)
    if getattr(model, "_hvdkeras_explicit", False):
        # The script's own data, callbacks and verbosity; only the steps are counted for --report-dir.
        kwargs["callbacks"] = _with_report(list(kwargs.get("callbacks") or []))
        return original(model, **kwargs)
    _distribute_held_optimizers(model)
    # The script's own dataset, before arrays become one here: a guess that warns, never refuses.
    data.check_batched(kwargs.get("x"), _model_input_ranks(model))
    if not opts.no_shard:
        kwargs = _sharded_fit_inputs(kwargs, opts.batch)
    _check_fit_inputs(model, kwargs)
    callbacks = _rank_zero_callbacks(list(kwargs.get("callbacks") or []), _shards_state(model))
    ours = [hvd_callbacks.BroadcastGlobalVariablesCallback(0), hvd_callbacks.MetricAverageCallback(),
            _MovingStatistics()]
    warm_lr = getattr(model, "_hvdkeras_warmup_lr", None)
    if warm_lr is not None and C.size() > 1:
        ours.append(_Warmup(warm_lr, warmup_epochs=opts.warmup_epochs))
    # Ours first: their results (global metrics, identical weights) are what the script's callbacks see.
    kwargs["callbacks"] = _with_report(ours + callbacks)
    if not rank_zero.is_rank_zero():
        kwargs["verbose"] = 0
    return original(model, **kwargs)


def _train_on_batch(original, model, *args, **kwargs):
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


def _model_input_ranks(model) -> list[int]:
    try:
        return [len(t.shape) for t in model.inputs or []]
    except (AttributeError, ValueError):  # a subclassed or not yet built model
        return []


def _check_fit_inputs(model, kwargs: dict) -> None:
    x = kwargs.get("x")
    if isinstance(x, tf.data.Dataset):
        data.check_steps(x, kwargs.get("steps_per_epoch"))
    elif _is_arrays(x):
        data.check_steps(x, kwargs.get("steps_per_epoch"), kwargs.get("batch_size"))


def _evaluate(original, model, *args, **kwargs):
    opts = _opts()
    kwargs = _named(original, args, kwargs)
    if isinstance(kwargs.get("callbacks"), keras.callbacks.CallbackList) or kwargs.get("_use_cached_eval_dataset"):
        # fit's own validation pass: its data and callbacks were prepared by our fit already.
        return original(model, **kwargs)
    if not opts.no_shard:
        x, y, sw = kwargs.get("x"), kwargs.get("y"), kwargs.get("sample_weight")
        if _is_arrays((x, y, sw)):
            kwargs["x"], kwargs["y"], kwargs["sample_weight"] = _shard_for_evaluation((x, y, sw))
        else:
            kwargs["x"] = _shard_for_evaluation(x)
    kwargs["callbacks"] = [hvd_callbacks.MetricAverageCallback()] + _rank_zero_callbacks(
        list(kwargs.get("callbacks") or []))
    if not rank_zero.is_rank_zero():
        kwargs["verbose"] = 0
    return original(model, **kwargs)


def _predict(original, model, *args, **kwargs):
    """Every worker predicts all of its input, since the script uses the predictions; only rank 0 shows the
    progress."""
    kwargs = _named(original, args, kwargs)
    if not rank_zero.is_rank_zero():
        kwargs["verbose"] = 0
    return original(model, **kwargs)


def _named(original, args: tuple, kwargs: dict) -> dict:
    """Positional arguments of fit/evaluate turned into keywords (after `self`)."""
    import inspect

    names = [p for p in inspect.signature(original).parameters if p != "self"]
    named = dict(zip(names, args))
    overlap = set(named) & set(kwargs)
    if overlap:
        raise TypeError(f"got multiple values for argument(s) {sorted(overlap)}")
    named.update(kwargs)
    return named


# ------------------------------------------------------------------------------------------------ files
def _write_on_rank_zero(original, model, filepath, *args, **kwargs):
    """`save` / `save_weights`: rank 0 writes atomically, the others wait for it (having first gathered a sharded
    optimizer's state with it, when every worker is here)."""
    if not rank_zero.in_solo():
        consolidate_optimizer_state(model)
    return rank_zero.on_rank_zero(saving.write_atomically, functools.partial(original, model), filepath,
                               *args, **kwargs)


def _export(original, model, filepath, *args, **kwargs):
    return rank_zero.on_rank_zero(original, model, filepath, *args, **kwargs)


# ----------------------------------------------------------------------------------------------- report
def weights_digest(arrays: Any) -> str:
    """sha256 of the arrays' bytes in order: equal on two workers exactly when their weights are identical."""
    digest = hashlib.sha256()
    for w in arrays:
        digest.update(np.ascontiguousarray(np.asarray(w)).tobytes())
    return digest.hexdigest()


def _report(model) -> None:
    """--report-dir: each worker writes rankN.json with its steps per fit, the digest of its final weights,
    which of the model's optimizers shard their state and each one's reducer, so a job's own CI can check that
    the workers stayed one job without changing the script."""
    sharded = list(sharded_optimizers(model))
    reducers = {name: repr(o.reducer) for name, o in held_optimizers(model).items()
                if isinstance(o, DistributedOptimizer)}
    saving.write_json_atomically(os.path.join(_opts().report_dir, f"rank{C.rank()}.json"),
                                 {"rank": C.rank(), "size": C.size(), "fit_steps": list(_state["fits"]),
                                  "weights_sha256": weights_digest(model.get_weights()),
                                  "sharded_optimizers": sharded, "reducers": reducers})
