"""Files: atomic writes (a crash never leaves a truncated checkpoint under the final name) and load_model.

Who writes is decided in `hvdkeras.training.rank_zero`; this module is how a file is written and read back.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import tempfile
from typing import Any, Callable, Iterator

import keras

from hvdkeras.compression import Compression


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yields a temporary path beside `path`; on success it is renamed to `path` in one step.

    A crash while writing never leaves a truncated file under the final name. The temporary name keeps
    `path`'s extension, since Keras picks the format from it.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    base, ext = os.path.splitext(os.path.basename(path))
    if base.endswith(".weights") and ext == ".h5":  # keep Keras's ".weights.h5" double suffix intact
        base, ext = base[: -len(".weights")], ".weights.h5"
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=f".tmp{ext}", dir=directory)
    os.close(fd)
    os.unlink(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
        # Leftovers of earlier writes of this file that were killed mid-way (one writer per file: rank 0).
        for stale in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(base)}.*.tmp{ext}")):
            with contextlib.suppress(OSError):
                os.unlink(stale)
    finally:
        if os.path.lexists(tmp):
            if os.path.isdir(tmp):
                import shutil

                shutil.rmtree(tmp, ignore_errors=True)
            else:
                os.unlink(tmp)


def write_atomically(write: Callable[..., Any], filepath: Any, *args: Any, **kwargs: Any) -> Any:
    """Calls `write(filepath, ...)` through `atomic_path` for a local `.keras` / `.h5` file, directly otherwise
    (remote URLs, directories, other formats)."""
    target = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
    if target is None or "://" in target or os.path.splitext(target)[1] not in (".keras", ".h5"):
        return write(filepath, *args, **kwargs)
    with atomic_path(target) as tmp:
        return write(tmp, *args, **kwargs)


def write_json_atomically(path: str | os.PathLike, obj: Any) -> None:
    """Writes `obj` as JSON to `path` through `atomic_path` (arrays and other objects as their `tolist()`)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


@contextlib.contextmanager
def atomic_model_writes(model: Any) -> Iterator[None]:
    """Within it, `model.save` and `model.save_weights` to local `.keras` / `.h5` paths write atomically.

    Instance attributes shadow the methods for the duration only, so whatever Keras code saves inside (a
    ModelCheckpoint) goes through `atomic_path`.
    """
    names = ("save", "save_weights")
    for name in names:
        model.__dict__[name] = functools.partial(write_atomically, getattr(model, name))
    try:
        yield
    finally:
        for name in names:
            model.__dict__.pop(name, None)


def load_model(
    filepath: str | os.PathLike,
    custom_optimizers: list | None = None,
    custom_objects: dict | None = None,
    compression: Any = Compression.none,
    legacy_opts: bool = False,
    *,
    compile: bool = True,
    safe_mode: bool = True,
    **distributed_kwargs: Any,
) -> keras.Model:
    """Loads a Keras model and wraps its optimizer in a DistributedOptimizer, as Horovod's `load_model` does.

    Models saved from an hvdkeras job are plain Keras files (the optimizer they record is the one the
    DistributedOptimizer wraps), so they also load with `keras.models.load_model` anywhere; this function
    restores the optimizer's state and wraps it again for training on.

    Args:
        filepath: a `.keras` file.
        custom_optimizers: optimizer classes of your own that the file uses (as in Horovod).
        custom_objects: as for `keras.models.load_model`.
        compression: `hvdkeras.Compression.none` (default) or `.fp16` for the wrapped optimizer.
        legacy_opts: Horovod's switch to tf.keras's legacy optimizers, which Keras 3 does not have: only
            False is accepted.
        compile: as for `keras.models.load_model`.
        safe_mode: as for `keras.models.load_model`.
        **distributed_kwargs: more DistributedOptimizer options (op, backward_passes_per_step, ...).

    Returns:
        The model, its optimizer a DistributedOptimizer with the saved state (iterations, slots).

    Example:
        >>> model = hvdkeras.load_model("ckpt.keras")
    """
    from hvdkeras.training.optimizer import DistributedLossScaleOptimizer, DistributedOptimizer

    if legacy_opts:
        raise ValueError("Keras 3 has no legacy optimizers (tf.keras.optimizers.legacy): load_model takes "
                         "legacy_opts=False only. Received: legacy_opts=True")
    # Files written by earlier hvdkeras versions name the wrapper itself.
    objects = {"DistributedOptimizer": DistributedOptimizer,
               "DistributedLossScaleOptimizer": DistributedLossScaleOptimizer}
    objects.update({cls.__name__: cls for cls in custom_optimizers or []})
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects, compile=compile, safe_mode=safe_mode)
    optimizer = getattr(model, "optimizer", None)
    if compile and optimizer is not None and not isinstance(optimizer, DistributedOptimizer):
        model.optimizer = DistributedOptimizer(optimizer, compression=compression, **distributed_kwargs)
    return model
