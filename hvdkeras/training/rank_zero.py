"""Rank-0 side effects: the one place that decides which worker does what only one worker may do.

Files, printing and rank-0-only callbacks go through `on_rank_zero` (or `is_rank_zero` where the other
ranks need not wait); code that runs on rank 0 alone marks itself with `solo()` so that nothing inside it
waits for ranks that are not there.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

from hvdkeras import _collectives as C


def is_rank_zero() -> bool:
    """True on rank 0, and in a process that never called `hvdkeras.init()` (a single worker)."""
    return not C.is_initialized() or C.rank() == 0


def barrier() -> None:
    """Waits for every worker; a no-op in a single process."""
    if C.is_initialized() and C.size() > 1:
        C.barrier()


_solo = threading.local()


@contextlib.contextmanager
def solo() -> Iterator[None]:
    """Marks code that runs on one rank only (a rank-0-only callback): `on_rank_zero` inside it never waits
    for the other ranks, who are not there to wait with."""
    previous = getattr(_solo, "active", False)
    _solo.active = True
    try:
        yield
    finally:
        _solo.active = previous


def in_solo() -> bool:
    """Whether this code runs on one rank only (inside `solo()`), so no collective may be started here."""
    return bool(getattr(_solo, "active", False))


def on_rank_zero(fn: Callable[..., Any], *args: Any, wait: bool = True, **kwargs: Any) -> Any:
    """Calls `fn` on rank 0 only; with `wait`, the other ranks wait until it has finished.

    Every rank must call this (it is a collective when `wait` is True), except inside `solo()`. An exception
    on rank 0 is raised there after the others have been released, so nobody hangs on it.

    Returns:
        fn's result on rank 0, None elsewhere.
    """
    if getattr(_solo, "active", False):
        return fn(*args, **kwargs) if is_rank_zero() else None
    result, error = None, None
    if is_rank_zero():
        try:
            result = fn(*args, **kwargs)
        except BaseException as err:  # re-raised below, after releasing the other ranks
            error = err
    if wait:
        barrier()
    if error is not None:
        raise error
    return result
