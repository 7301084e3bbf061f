"""Validation at the boundary, in one format: "`name` must be WHAT. Received: name=VALUE".

`check_int` is the one integer check of the package's arguments, `check_number` the one check of a finite
number (a rate, a number of epochs, a factor); `env_int` reads a launcher's integer variables (RANK,
SLURM_PROCID, ...). hvdkeras's own HVDKERAS_* variables are read by `hvdkeras.settings`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping


def check_int(name: str, value: Any, minimum: int = 1, *, maximum: int | None = None, allow_none: bool = False,
              unit: str = "", hint: str = "", error: type[Exception] = ValueError) -> Any:
    """`value` as an int, if it is an integer (not a bool) in [minimum, maximum).

    Args:
        name: the argument's name, for the message.
        value: what was received.
        minimum: the smallest value allowed.
        maximum: if given, values must be below it.
        allow_none: None passes through unchanged.
        unit: what the integer counts, e.g. "bytes" ("an integer number of bytes >= 0").
        hint: words added after the bound, e.g. "(0: one allreduce)".
        error: the exception class raised.

    Raises:
        `error` (ValueError by default): naming the argument, the bound and what was received.

    Example:
        >>> check_int("backward_passes_per_step", 0)
        Traceback (most recent call last):
        ValueError: `backward_passes_per_step` must be an integer >= 1. Received: backward_passes_per_step=0
    """
    if value is None and allow_none:
        return None
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if ok and value >= minimum and (maximum is None or value < maximum):
        return int(value)
    bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum})"
    extra = " or None" if allow_none else ""
    what = f"an integer number of {unit}" if unit else "an integer"
    raise error(f"`{name}` must be {what} {bound}{extra}{' ' + hint if hint else ''}. Received: {name}={value!r}")


def check_number(name: str, value: Any, minimum: float = 0.0, *, exclusive: bool = False, what: str = "a number",
                 error: type[Exception] = ValueError) -> float:
    """`value` as a float, if it is a finite real number (not a bool) >= minimum (> minimum with `exclusive`).

    Args:
        name: the argument's name, for the message.
        value: what was received.
        minimum: the bound.
        exclusive: the bound itself is not allowed.
        what: what the number is, e.g. "a number of epochs".
        error: the exception class raised.

    Raises:
        `error` (ValueError by default): naming the argument, the bound and what was received.

    Example:
        >>> check_number("warmup_epochs", -1)
        Traceback (most recent call last):
        ValueError: `warmup_epochs` must be a finite number >= 0. Received: warmup_epochs=-1
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > minimum if exclusive else value >= minimum):
        return float(value)
    finite = what.replace("a number", "a finite number", 1) if what.startswith("a number") else what
    bound = f"{'>' if exclusive else '>='} {minimum:g}"
    raise error(f"`{name}` must be {finite} {bound}. Received: {name}={value!r}")


def _raw(environ: Mapping[str, str], name: str) -> str:
    return (environ.get(name) or "").strip()


def _bad(name: str, what: str, raw: str, error: type[Exception]) -> Exception:
    return error(f"{name} must be {what}. Received: {name}={raw!r}")


def env_int(environ: Mapping[str, str], name: str, default: Any = None, minimum: int = 0,
            maximum: int | None = None, error: type[Exception] = ValueError) -> Any:
    """An integer from `environ[name]` in [minimum, maximum], or `default` when it is unset or empty.

    Raises:
        `error` (ValueError by default): the value is not such an integer, naming the variable and its value.
    """
    raw = _raw(environ, name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        what = f"an integer >= {minimum}" if maximum is None else f"an integer in [{minimum}, {maximum}]"
        raise _bad(name, what, environ[name], error)
    return value
