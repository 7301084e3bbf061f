"""The wrap's state in this process, one object: `STATE` (its options, the warnings given, the steps of each fit,
whether a model is being loaded)."""

from __future__ import annotations

import dataclasses
import warnings

from hvdkeras.training import rank_zero
from hvdkeras.wrap.options import Options


@dataclasses.dataclass
class WrapState:
    """What the installed wrap keeps between calls."""

    options: Options | None = None  # the installed options (None: not installed)
    warned: set[str] = dataclasses.field(default_factory=set)  # the keys of the warnings given once
    fits: list[int] = dataclasses.field(default_factory=list)  # each fit's steps, for --report-dir
    loading: int = 0  # > 0 while `load_model` compiles a model (its saved rate is not scaled again)


STATE = WrapState()


def warn_once(key: str, message: str) -> None:
    """Warns (on rank 0) with `message` the first time `key` is seen in this process."""
    if key not in STATE.warned:
        STATE.warned.add(key)
        if rank_zero.is_rank_zero():
            warnings.warn(f"hvdkeras: {message}", stacklevel=3)
