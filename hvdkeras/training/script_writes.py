"""What a wrapped script's own writes do on the ranks other than 0 (`hvdkeras run`, `python -m hvdkeras`).

Every rank runs the whole script, so every rank reaches each of its writes. The rule, for the writes below:
rank 0 makes them, and the other ranks see rank 0's result; reading stays as it is on every rank.

- Folders: the script's own `os.mkdir` and `os.makedirs` (called from the script's code, not from a library)
  on a rank other than 0 wait for rank 0 to make the folder, then return as if they had made it; after 60 s
  without it, they make it themselves. On every rank, a folder that another
  rank of this job made after the job started counts as this rank's own, so `os.mkdir(checkpoint_dir)` in a
  TensorFlow tutorial no longer dies with FileExistsError on one rank; a folder that existed before the job
  still raises, as in one process.
- TensorFlow checkpoints (`tf.train.Checkpoint.save` / `write`, and `tf.train.CheckpointManager.save`, which
  writes through them): rank 0 writes them (TensorFlow writes the index last); the others write nothing, and
  their Checkpoint and CheckpointManager objects advance as rank 0's do (the save counter, the manager's list
  of checkpoints and its latest one), so `manager.latest_checkpoint` names the same file on every rank.
  On the other ranks, restoring a checkpoint that rank 0 of this job is writing, making a CheckpointManager of
  its folder and `tf.train.latest_checkpoint` of it first wait until rank 0's newest checkpoint there is
  written (its index, and the folder's state file naming it).
- `tf.summary.create_file_writer`: on the other ranks a writer that writes nothing, so TensorBoard shows one
  run.

Other writes (`open(path, "w")` in the script) are left as they are: every rank writes them, with the same
content where it comes from the model, which is the same on every rank. Installed as the patch
"script_writes" (part of `wrap.install`).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import time
from typing import Any

import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint as tf_checkpoint
from tensorflow.python.checkpoint import checkpoint_management

from hvdkeras import _collectives as C
from hvdkeras import patches
from hvdkeras.settings import DEFAULT_WRITE_WAIT

PATCH = "script_writes"
# pending: on ranks other than 0, the checkpoints rank 0 is writing: path -> whether the folder's state file will
# name it (a save or a manager's save; a plain write has no state).
_state: dict[str, Any] = {"job_start": None, "pending": {}, "wait": DEFAULT_WRITE_WAIT}
_LIBRARY_DIRS = tuple(
    os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                                             "platlib")})
_PACKAGE_DIR = os.path.dirname(os.path.realpath(__file__)) + os.sep
# os's own code: its file, or "<frozen os>" where Python runs it frozen (3.11 and later).
_OS_FILES = frozenset({os.path.realpath(os.__file__), "<frozen os>"})


def install(job_start: float, wait_seconds: float = DEFAULT_WRITE_WAIT) -> bool:
    """Installs the rule of the module's docstring.

    Args:
        job_start: when the job started (seconds since the epoch, the earliest rank's start): a folder made
            since then was made by this job.
        wait_seconds: how long a rank other than 0 waits for rank 0's folder or checkpoint (HVDKERAS_WRITE_WAIT,
            read by `python -m hvdkeras`).
    """
    _state.update(job_start=job_start, wait=wait_seconds)
    changes = [(os, "mkdir", _mkdir(os.mkdir)),
               (tf_checkpoint.Checkpoint, "_write", _checkpoint_write(vars(tf_checkpoint.Checkpoint)["_write"])),
               (tf_checkpoint.Checkpoint, "restore",
                _checkpoint_restore(vars(tf_checkpoint.Checkpoint)["restore"])),
               (checkpoint_management.CheckpointManager, "__init__",
                _manager_init(vars(checkpoint_management.CheckpointManager)["__init__"])),
               (tf.train, "latest_checkpoint", _latest_checkpoint(tf.train.latest_checkpoint)),
               (tf.summary, "create_file_writer", _file_writer(tf.summary.create_file_writer))]
    return patches.install(PATCH, changes)


def uninstall() -> bool:
    _state["pending"].clear()
    return patches.uninstall(PATCH)


def _rank() -> int:
    return C.rank() if C.is_initialized() else 0


def from_script(frame: Any) -> bool:
    """Whether `frame`'s code is the script's own: not Python's library, an installed package or hvdkeras.
    Frames of os.py itself (os.makedirs calling os.mkdir) are looked through."""
    while frame is not None and _code_file(frame) in _OS_FILES:
        frame = frame.f_back
    if frame is None:
        return False
    path = _code_file(frame)
    return not (path.startswith(_LIBRARY_DIRS) or path.startswith(_PACKAGE_DIR) or path.startswith("<"))


def _code_file(frame: Any) -> str:
    """The file of `frame`'s code, resolved; a name such as "<frozen os>" or "<string>" as it is."""
    name = frame.f_code.co_filename
    return name if name.startswith("<") else os.path.realpath(name)


def made_by_this_job(path: Any) -> bool:
    """Whether the folder `path` exists and was made since the job started (by some rank of it)."""
    try:
        made = os.stat(path).st_mtime
    except OSError:
        return False
    return os.path.isdir(path) and _state["job_start"] is not None and made >= _state["job_start"]


def _mkdir(os_mkdir):
    def mkdir(path, mode=0o777, *, dir_fd=None):
        if dir_fd is not None or not from_script(sys._getframe(1)):
            return os_mkdir(path, mode, dir_fd=dir_fd) if dir_fd is not None else os_mkdir(path, mode)
        if _rank() != 0:
            deadline = time.monotonic() + _state["wait"]
            while not os.path.isdir(path) and time.monotonic() < deadline:
                time.sleep(0.05)
            if made_by_this_job(path):
                return None
        try:
            return os_mkdir(path, mode)
        except FileExistsError:
            if made_by_this_job(path):
                return None
            raise

    mkdir.__wrapped__ = os_mkdir
    mkdir.__doc__ = os_mkdir.__doc__
    return mkdir


def _checkpoint_write(tf_write):
    def _write(checkpoint, file_prefix, options=None):
        if _rank() == 0:
            return tf_write(checkpoint, file_prefix, options=options)
        # The path rank 0 writes; the manager's callbacks keep its state as rank 0's, touching no file here.
        path = os.fspath(file_prefix) if not tf.is_tensor(file_prefix) else file_prefix.numpy().decode()
        callbacks = getattr(options, "experimental_write_callbacks", None) or []
        _state["pending"][path] = bool(callbacks)
        if callbacks:
            with _no_files():
                for callback in callbacks:
                    callback(path)
        return path

    _write.__wrapped__ = tf_write
    return _write


def _await(path: str) -> None:
    """Waits (up to the bound) until rank 0 has written the checkpoint `path`: its index, and where the save
    records it, the folder's state file naming it."""
    names_it = _state["pending"].pop(path, None)
    if names_it is None:
        return
    deadline = time.monotonic() + _state["wait"]

    def written() -> bool:
        if not os.path.exists(path + ".index"):
            return False
        if not names_it:
            return True
        recorded = checkpoint_management.get_checkpoint_state(os.path.dirname(path) or ".")
        return recorded is not None and os.path.basename(recorded.model_checkpoint_path) == os.path.basename(path)

    while not written() and time.monotonic() < deadline:
        time.sleep(0.05)


def _await_folder(directory: Any) -> None:
    """Waits for the newest checkpoint rank 0 is writing in `directory` (older ones it may have deleted)."""
    folder = os.path.realpath(os.fspath(directory))
    mine = [p for p in _state["pending"] if os.path.realpath(os.path.dirname(p) or ".") == folder]
    for path in mine[:-1]:
        _state["pending"].pop(path)
    if mine:
        _await(mine[-1])


def _checkpoint_restore(tf_restore):
    def restore(checkpoint, save_path, options=None):
        if isinstance(save_path, (str, os.PathLike)):
            _await(os.fspath(save_path))
        return tf_restore(checkpoint, save_path, options=options)

    restore.__wrapped__ = tf_restore
    restore.__doc__ = tf_restore.__doc__
    return restore


def _manager_init(tf_init):
    def __init__(manager, checkpoint, directory, *args, **kwargs):  # noqa: N807 - the patched constructor
        _await_folder(directory)
        tf_init(manager, checkpoint, directory, *args, **kwargs)

    __init__.__wrapped__ = tf_init
    return __init__


def _latest_checkpoint(tf_latest_checkpoint):
    def latest_checkpoint(checkpoint_dir, *args, **kwargs):
        _await_folder(checkpoint_dir)
        return tf_latest_checkpoint(checkpoint_dir, *args, **kwargs)

    latest_checkpoint.__wrapped__ = tf_latest_checkpoint
    latest_checkpoint.__doc__ = tf_latest_checkpoint.__doc__
    return latest_checkpoint


class _no_files:  # noqa: N801 - used as a context manager
    """While a CheckpointManager's write callback runs on a rank other than 0: its state file and the deletion
    of old checkpoints, both rank 0's to do, touch nothing."""

    def __enter__(self):
        self._saved = (checkpoint_management.update_checkpoint_state_internal,
                       checkpoint_management._delete_file_if_exists)
        checkpoint_management.update_checkpoint_state_internal = lambda *args, **kwargs: None
        checkpoint_management._delete_file_if_exists = lambda *args, **kwargs: None
        return self

    def __exit__(self, *exc):
        (checkpoint_management.update_checkpoint_state_internal,
         checkpoint_management._delete_file_if_exists) = self._saved
        return False


def _file_writer(tf_create_file_writer):
    def create_file_writer(logdir, *args, **kwargs):
        if _rank() != 0:
            return tf.summary.create_noop_writer()
        return tf_create_file_writer(logdir, *args, **kwargs)

    create_file_writer.__wrapped__ = tf_create_file_writer
    create_file_writer.__doc__ = tf_create_file_writer.__doc__
    return create_file_writer
