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
- The learning rate: warm-up until the script sets the rate itself, which then keeps it (`fit_callbacks.Warmup`).
- `train_on_batch`: rank 0's weights are broadcast before the first update (no fit callbacks run there).
- `predict`: progress on rank 0 only (every rank predicts all of its input).
- `save`, `save_weights`, `export`: rank 0 writes (atomically), the others wait for it.
A model that the script compiles with a DistributedOptimizer itself is left as the script made it.

The wrap is a folder of modules of one job each: options (Options), state (the one STATE object), compile,
inputs (each worker's share of the data), methods (fit, evaluate, predict, train_on_batch), fit_callbacks,
files (rank 0's writes) and report (--report-dir); this module installs and uninstalls it.
"""

from __future__ import annotations

import functools

import keras

from hvdkeras import patches
from hvdkeras.compression import Compression
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.settings import DEFAULT_WRITE_WAIT
from hvdkeras.training import keras_output, loops, script_writes, strategy
from hvdkeras.training.models import use_xla_setting
from hvdkeras.wrap.compile import compile_from_config, compile_model
from hvdkeras.wrap.files import export, write_on_rank_zero
from hvdkeras.wrap.methods import evaluate, fit, predict, train_on_batch
from hvdkeras.wrap.options import Options, options_from_env
from hvdkeras.wrap.report import weights_digest
from hvdkeras.wrap.state import STATE

__all__ = ["Options", "install", "installed", "options_from_env", "uninstall", "weights_digest"]


def installed() -> bool:
    return patches.installed("wrap")


def install(options: Options | None = None, write_wait: float = DEFAULT_WRITE_WAIT) -> None:
    """Makes `keras.Model` data-parallel in this process (the "wrap" patch; `uninstall` undoes it).

    Installing again only replaces the options. `write_wait`: how long a rank other than 0 waits for a folder
    or checkpoint of the script's that rank 0 writes (HVDKERAS_WRITE_WAIT; hvdkeras.training.script_writes).
    """
    STATE.options = options or Options()
    use_xla_setting(STATE.options.xla)  # what the callbacks follow too
    replacements = (("compile", compile_model), ("compile_from_config", compile_from_config), ("fit", fit),
                    ("train_on_batch", train_on_batch), ("evaluate", evaluate), ("predict", predict),
                    ("save", write_on_rank_zero),
                    ("save_weights", write_on_rank_zero), ("export", export))
    patches.install("wrap", [(_owner(name), name, _bind(getattr(keras.Model, name), replacement))
                             for name, replacement in replacements])
    keras_output.install()
    strategy.install()
    loops.install(ReductionOptions(compression=Compression.fp16 if STATE.options.fp16_allreduce else Compression.none),
                  batch=None if STATE.options.no_shard else STATE.options.batch, reducer=STATE.options.reducer)
    script_writes.install(job_start=_job_start(), wait_seconds=write_wait)


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
        if getattr(self, "_hvdkeras_explicit", False) and replacement not in (compile_model, compile_from_config, fit):
            return original(self, *args, **kwargs)
        return replacement(original, self, *args, **kwargs)

    return method


def uninstall() -> None:
    patches.uninstall("wrap")
    keras_output.uninstall()
    strategy.uninstall()
    loops.uninstall()
    script_writes.uninstall()
    STATE.options = None
    use_xla_setting(None)


def _job_start() -> float:
    """When the job started, for the folders this job made: this process's start. Every rank's process starts
    before any rank runs the script, since `init()` forms the job from all of them first; no collective here,
    so a worker that joins an elastic job later installs the wrap alone."""
    import psutil

    return psutil.Process().create_time()
