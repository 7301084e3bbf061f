"""Keras speaks once: what Keras itself prints, warns or logs comes from rank 0 only in a wrapped script.

Installed by `wrap.install` (`python -m hvdkeras`, `hvdkeras run`) as the patch "keras_output". On every
rank other than 0:
- `Model.summary()` and `keras.utils.plot_model` print and write nothing;
- Keras's own messages (`keras.src.utils.io_utils.print_msg`: its callbacks' verbose lines, for example)
  are not printed;
- Python warnings raised by Keras, TensorFlow or absl code are not shown;
- records below ERROR of the "absl" and "tensorflow" loggers are dropped.
Errors and tracebacks are never touched, nor is anything the script prints or warns itself. Whether a
process is rank 0 is asked at each call, so an elastic job that renumbers its workers stays right.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from typing import Any

import keras

from hvdkeras import patches
from hvdkeras.training import rank_zero

PATCH = "keras_output"
# Modules whose warnings are Keras's own (the module of the code that called warnings.warn).
QUIET_MODULES = ("keras", "tensorflow", "absl")
QUIET_LOGGERS = ("absl", "tensorflow")


def _on_rank_zero_only(original):
    @functools.wraps(original)
    def gated(*args, **kwargs):
        if rank_zero.is_rank_zero():
            return original(*args, **kwargs)
        return None

    return gated


def _warning_origin(frame: Any) -> str:
    """The module of the code that raised a warning: the first frame outside the warnings machinery."""
    while frame is not None and frame.f_globals.get("__name__") in ("warnings", __name__):
        frame = frame.f_back
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


def is_quiet_module(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in QUIET_MODULES)


def _showwarning(original):
    @functools.wraps(original)
    def showwarning(message, category, filename, lineno, file=None, line=None):
        if not rank_zero.is_rank_zero() and is_quiet_module(_warning_origin(sys._getframe(1))):
            return None
        return original(message, category, filename, lineno, file, line)

    return showwarning


class RankZeroRecords(logging.Filter):
    """Drops a logger's records below ERROR on ranks other than 0."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or rank_zero.is_rank_zero()


_FILTER = RankZeroRecords()


def _utils_modules() -> list[Any]:
    """The module objects through which scripts reach `plot_model`: keras.utils and tf.keras.utils."""
    modules = [keras.utils]
    tf_keras_utils = sys.modules.get("keras._tf_keras.keras.utils")
    if tf_keras_utils is None:
        try:
            from keras._tf_keras.keras import utils as tf_keras_utils
        except ImportError:  # a Keras without the tf.keras namespace
            tf_keras_utils = None
    if tf_keras_utils is not None and tf_keras_utils is not keras.utils:
        modules.append(tf_keras_utils)
    return [m for m in modules if hasattr(m, "plot_model")]


def install() -> bool:
    """Quiets Keras on ranks other than 0 (see the module's docstring). Returns False if already installed."""
    from keras.src.utils import io_utils, model_visualization

    summary_owner = next(cls for cls in keras.Model.__mro__ if "summary" in vars(cls))
    changes = [(summary_owner, "summary", _on_rank_zero_only(vars(summary_owner)["summary"])),
               (io_utils, "print_msg", _on_rank_zero_only(io_utils.print_msg)),
               (model_visualization, "plot_model", _on_rank_zero_only(model_visualization.plot_model)),
               (warnings, "showwarning", _showwarning(warnings.showwarning))]
    changes += [(module, "plot_model", _on_rank_zero_only(module.plot_model)) for module in _utils_modules()]
    if not patches.install(PATCH, changes):
        return False
    for name in QUIET_LOGGERS:
        logging.getLogger(name).addFilter(_FILTER)
    return True


def uninstall() -> bool:
    if not patches.uninstall(PATCH):
        return False
    for name in QUIET_LOGGERS:
        logging.getLogger(name).removeFilter(_FILTER)
    return True
