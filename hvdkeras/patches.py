"""Every change hvdkeras makes to Keras's classes, each installed explicitly and undone the same way.

Importing hvdkeras changes nothing in Keras. The patches, by name:
- "compile_config" (`optimizer.install_compile_config`): `keras.Model.get_compile_config` records a
  DistributedOptimizer as the optimizer it wraps, so saved models load with plain Keras. Installed by the
  first `DistributedOptimizer(...)`.
- "loss_scale_passthrough" (`optimizer.install_loss_scale_passthrough`): `keras.optimizers.LossScaleOptimizer(opt)`
  gives `opt` back when it is a DistributedLossScaleOptimizer (which scales its loss already), so `compile` under
  mixed_float16 keeps it. Installed by the first DistributedLossScaleOptimizer.
- "sync_batch_norm" (`sync_batch_norm.install`): `keras.layers.BatchNormalization._moments` synchronizes
  layers made with `synchronized=True` across the workers. Installed by `init()`.
- "optimizer_variables_call" (`tf2.install_variables_call`): a Keras 3 optimizer's `variables` list may also be
  called, as Keras 2's `optimizer.variables()` (Horovod's TF2 loop calls it). Installed by `init()`.
- "wrap" (`wrap.install`): `keras.Model.compile`, `compile_from_config`, `fit`, `train_on_batch`, `evaluate`, `predict`,
  `save`, `save_weights` and `export` (set on the Keras classes that define them) make an unmodified
  script data-parallel. Installed by `python -m hvdkeras` / `hvdkeras run` only, with the four below.
- "keras_output" (`keras_output.install`): `Model.summary`, `keras.utils.plot_model` (and tf.keras's),
  `keras.src.utils.io_utils.print_msg` and `warnings.showwarning` stay silent on ranks other than 0 for
  Keras's own output; a filter on the "absl" and "tensorflow" loggers drops their records below ERROR there.
- "loops" (`loops.install`): `apply` of Keras's base optimizer and LossScaleOptimizer all-reduces the gradients
  of a script's own training loop at the outermost optimizer, and broadcasts rank 0's variables before the
  optimizer's first update; `tf.data.Dataset.__iter__` splits the batches the script iterates, and Keras
  metrics' `result` reads the global states; with strategy_loops.py, the `tf.distribute` strategies'
  `experimental_distribute_dataset`, `distribute_datasets_from_function`, `run` and `reduce`,
  `tf.nn.compute_average_loss`, `tf.nn.scale_regularization_loss` and Keras's loss scaling for distribution
  make the workers more replicas of the script's strategy.
- "script_writes" (`script_writes.install`): the script's own `os.mkdir` / `os.makedirs`, TensorFlow checkpoints
  (`tf.train.Checkpoint._write`, `restore`) and `tf.summary.create_file_writer`: rank 0 writes, the other ranks
  see its result.
- "tf_distribute" (`strategy.install`): `tf.distribute.MultiWorkerMirroredStrategy` (and its experimental
  name) become a MirroredStrategy over the process's own devices.

`uninstall(name)` restores the attributes a patch replaced; `hvdkeras.shutdown()` undoes the ones `init()`
installed.
"""

from __future__ import annotations

from typing import Any, Iterable

_MISSING = object()
# name -> [(owner, attribute, what the owner's own __dict__ held before, or _MISSING)]
_installed: dict[str, list[tuple[Any, str, Any]]] = {}


def install(name: str, changes: Iterable[tuple[Any, str, Any]]) -> bool:
    """Sets each `owner.attribute = replacement` of `changes`, remembered under `name`.

    Returns:
        False, changing nothing, when `name` is installed already.
    """
    if name in _installed:
        return False
    saved = []
    for owner, attribute, replacement in changes:
        saved.append((owner, attribute, vars(owner).get(attribute, _MISSING)))
        setattr(owner, attribute, replacement)
    _installed[name] = saved
    return True


def uninstall(name: str) -> bool:
    """Puts back what `install(name, ...)` replaced. Returns False when `name` is not installed."""
    saved = _installed.pop(name, None)
    if saved is None:
        return False
    for owner, attribute, original in reversed(saved):
        if original is _MISSING and attribute == "__new__":
            setattr(owner, attribute, _inherited_new(owner))
        elif original is _MISSING:
            delattr(owner, attribute)
        else:
            setattr(owner, attribute, original)
    return True


def _inherited_new(owner: type) -> staticmethod:
    """A `__new__` that makes objects as `owner`'s bases do. A class's own `__new__`, once set, cannot be taken
    out again (Python keeps calling through it, and `object.__new__` then refuses the constructor's
    arguments), so uninstalling one the class did not define leaves this in its place."""
    base = next(cls for cls in owner.__mro__[1:] if "__new__" in vars(cls))

    def __new__(cls, *args: Any, **kwargs: Any):
        return object.__new__(cls) if base is object else base.__new__(cls, *args, **kwargs)

    return staticmethod(__new__)


def installed(name: str) -> bool:
    return name in _installed


def active() -> list[str]:
    """The names of the patches installed now."""
    return list(_installed)
