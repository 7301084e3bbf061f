"""The collectives users call directly (Horovod's parameters), and the checks that the workers' models agree."""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Iterable, Sequence

import numpy as np
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras import compression as _compression
from hvdkeras import settings
from hvdkeras.variables import tf_variable, to_tensor

log = logging.getLogger("hvdkeras")

Average = C.Average
Sum = C.Sum


# The ops a tensor (not a gradient) may be all-reduced with, as in Horovod.
TENSOR_OPS = (C.Average, C.Sum, C.Min, C.Max, C.Product)


def op_from(average: Any, op: Any, allow: Any = TENSOR_OPS) -> int:
    """Horovod's rule: `average` (deprecated) and `op` exclude each other; neither means Average."""
    if average is not None and op is not None:
        raise ValueError(f"Pass `op` or the deprecated `average`, not both. Received: average={average!r}, op={op!r}")
    if average is not None:
        return C.Average if average else C.Sum
    return C.Average if op is None else C.check_op(op, allow)


def allreduce(
    value: Any,
    name: str | None = None,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: int | None = None,
    compression: Any = _compression.Compression.none,
    process_set: Any = C.global_process_set,
    *,
    device_dense: str = "",
    device_sparse: str = "",
    ignore_name_scope: bool = False,
) -> tf.Tensor:
    """Averages (or sums) a tensor across all workers (Horovod's `hvd.allreduce`, same parameters).

    Args:
        value: a tensor, array, number or Keras variable (same shape and dtype on every worker).
        name: optional name of the collective (must match across workers if given).
        average: deprecated, as in Horovod: True is op=Average, False op=Sum.
        prescale_factor: multiply by this before the reduction.
        postscale_factor: multiply by this after the reduction.
        op: `hvdkeras.Average` (the default), `hvdkeras.Sum`, `hvdkeras.Min`, `hvdkeras.Max` or
            `hvdkeras.Product`.
        compression: `hvdkeras.Compression.none` or `.fp16`.
        process_set: reduce among the ranks of this `hvdkeras.ProcessSet` only (default: all).
        device_dense, device_sparse, ignore_name_scope: keyword only, horovod.tensorflow's; `device_dense`
            places the reduction, the other two change nothing here (names are always taken as given).

    Returns:
        A tensor with the reduced value, the same on every worker.

    Example:
        >>> hvd.allreduce([0.2, -0.1, 0.5])  # with [0.4, 0.0, 0.3] on the other worker
        <tf.Tensor: [0.3, -0.05, 0.4]>
    """
    op = op_from(average, op)
    compressor = _compression.get(compression)
    t = to_tensor(value)
    sent, ctx = compressor.compress(t)
    with tf.device(device_dense):
        out = C.allreduce(sent, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          name=name, process_set=process_set)
    return compressor.decompress(out, ctx)


def reducescatter(value: Any, name: str | None = None, op: int = Average,
                  process_set: Any = C.global_process_set, *, device_dense: str = "",
                  compression: Any = _compression.Compression.none, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduces a tensor across workers and gives each its slice of the first axis (Horovod's reducescatter;
    the keyword-only parameters are horovod.tensorflow's)."""
    compressor = _compression.get(compression)
    sent, ctx = compressor.compress(to_tensor(value))
    with tf.device(device_dense):
        out = C.reducescatter(sent, op=C.check_op(op), name=name, process_set=process_set,
                              prescale_factor=prescale_factor, postscale_factor=postscale_factor)
    return compressor.decompress(out, ctx)


def allgather(value: Any, name: str | None = None, process_set: Any = C.global_process_set, *,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """Concatenates every worker's tensor along the first axis (first dimensions may differ)."""
    return C.allgather(to_tensor(value), name=name, process_set=process_set)


def broadcast(value: Any, root_rank: int = 0, name: str | None = None,
              process_set: Any = C.global_process_set, *, ignore_name_scope: bool = False) -> tf.Tensor:
    """Returns root_rank's value of `value` on every worker."""
    _check_root_rank(root_rank)
    return C.broadcast(to_tensor(value), root_rank, name=name, process_set=process_set)


def broadcast_global_variables(root_rank: int) -> None:
    """Horovod's TF1 call: TensorFlow 2 has no global variables, and Horovod raises here too.

    Raises:
        RuntimeError: always, naming what to use instead.
    """
    raise RuntimeError(
        "broadcast_global_variables() needs TensorFlow 1's global variable collection, which TensorFlow 2 and "
        "Keras 3 do not have (Horovod raises in eager mode as well). Use "
        "hvdkeras.callbacks.BroadcastGlobalVariablesCallback(root_rank) in fit, or "
        f"hvdkeras.broadcast_variables(model.variables, root_rank={root_rank!r}) in a custom loop."
    )


def _check_root_rank(root_rank: Any) -> None:
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)):
        raise TypeError(f"`root_rank` must be an integer. Received: root_rank={root_rank!r}")
    if not 0 <= root_rank < C.size():
        raise ValueError(
            f"`root_rank` must be in [0, size()) = [0, {C.size()}). Received: root_rank={root_rank}"
        )


def _describe(variable: Any) -> tuple[str, tuple, str]:
    name = getattr(variable, "path", None) or getattr(variable, "name", "?")
    dtype = variable.dtype
    return str(name), tuple(int(d) if d is not None else -1 for d in variable.shape), getattr(dtype, "name", str(dtype))


def check_same_variables(variables: Sequence[Any]) -> None:
    """Raises on every worker, naming the first variable that differs, when workers hold different models.

    One allgather of a digest of the shapes and dtypes (names may differ legitimately: Keras numbers layers
    per process); only on a mismatch are the full lists exchanged to say where.

    Raises:
        ValueError: the variables differ in number, shape or dtype between workers.
    """
    if not C.is_initialized() or C.size() == 1:
        return
    described = [_describe(v) for v in variables]
    digest = hashlib.sha256(repr([(shape, dtype) for _, shape, dtype in described]).encode()).hexdigest()
    digests = C.allgather_object(digest, name="hvdkeras.check_models.digest")
    if len(set(digests)) == 1:
        return
    everyone = C.allgather_object(described, name="hvdkeras.check_models.variables")
    raise ValueError(_mismatch_message(everyone))


def _mismatch_message(everyone: list[list[tuple[str, tuple, str]]]) -> str:
    def show(entry):
        name, shape, dtype = entry
        return f"{name!r} shape={shape} dtype={dtype}"

    reference = everyone[0]
    for rank, mine in enumerate(everyone[1:], start=1):
        for i in range(max(len(reference), len(mine))):
            a = reference[i] if i < len(reference) else None
            b = mine[i] if i < len(mine) else None
            if a is None or b is None or a[1:] != b[1:]:
                detail = (
                    f"variable #{i}: rank 0 has {show(a) if a else 'nothing'}, "
                    f"rank {rank} has {show(b) if b else 'nothing'}"
                )
                return (
                    "The workers built different models, so their gradients cannot be averaged. First "
                    f"difference at {detail} (rank 0 has {len(reference)} variables, rank {rank} has {len(mine)}). "
                    "Build the same model on every worker. To skip this check, pass check_models=False to "
                    "BroadcastGlobalVariablesCallback or set HVDKERAS_CHECK_MODELS=0."
                )
    return "The workers built different models (their variable digests differ)."


_WORDS = {1: tf.int8, 2: tf.int16, 4: tf.int32, 8: tf.int64}


def checksums(variables: Sequence[Any]) -> list[int]:
    """One integer per variable, computed from its bits: the sum of its words, wrapping as int64.

    Integer sums do not depend on the order of summation, so two workers' checksums of a variable are
    equal whenever its values are bit-identical; a real divergence makes them differ.
    """
    out = []
    for var in variables:
        value = tf.convert_to_tensor(var)
        if value.dtype == tf.bool:
            value = tf.cast(value, tf.int8)
        words = value if value.dtype.is_integer else tf.bitcast(value, _WORDS[value.dtype.size])
        out.append(int(tf.reduce_sum(tf.cast(words, tf.int64)).numpy()))
    return out


def check_in_sync(variables: Sequence[Any], when: str, hint: str = "") -> None:
    """Raises on every worker, naming the first variable, when the workers' values of `variables` differ.

    One allgather of one integer per variable (`checksums`). Data-parallel workers apply the same averaged
    gradients to the same weights, so their trainable weights stay bit-identical; a difference means some
    gradients were applied without being averaged, and the workers no longer train one model.

    Args:
        variables: the variables, in the same order on every worker.
        when: when the check runs, for the message ("after epoch 1").
        hint: what to do, appended to the message.

    Raises:
        RuntimeError: the values differ between workers.
    """
    variables = list(variables)
    if not C.is_initialized() or C.size() == 1 or not variables:
        return
    everyone = C.allgather_object(checksums(variables), name="hvdkeras.check_models.checksums")
    for rank, mine in enumerate(everyone[1:], start=1):
        for i, (a, b) in enumerate(zip(everyone[0], mine)):
            if a != b:
                name = _describe(variables[i])[0]
                raise RuntimeError(
                    f"The workers' weights differ {when}: {name!r} (variable #{i} of {len(variables)}) is not "
                    f"the same on rank 0 and rank {rank}, so the workers no longer train one model. {hint}"
                    "To skip this check, pass check_models=False to BroadcastGlobalVariablesCallback or set "
                    "HVDKERAS_CHECK_MODELS=0.")


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0, process_set: Any = C.global_process_set,
                        inplace: bool = False, *, check: bool | None = None,
                        name: str = "hvdkeras.broadcast_variables") -> None:
    """Sets every worker's variables to root_rank's values, in place (Horovod's `broadcast_variables`).

    Works with Keras 3 `keras.Variable`s (which have no `.ref()`), a Keras 3 optimizer's variables and
    `tf.Variable`s, eagerly and inside `tf.function` (Horovod's TF2 loop broadcasts on its first step, after the
    optimizer has made its state). Eagerly, it first checks that every worker holds the same variables (shapes
    and dtypes), so different models fail at once with the first variable that differs instead of hanging or
    failing later in a collective; inside `tf.function` that check is left out (it exchanges Python objects).

    Args:
        variables: the variables, in the same order on every worker.
        root_rank: the worker whose values are kept.
        process_set: broadcast among the ranks of this `hvdkeras.ProcessSet` only (default: all).
        inplace: Horovod's choice between its in-place and its assigning broadcast; both give the same values,
            and hvdkeras always assigns (one broadcast per dtype of all the variables packed together).
        check: keyword only; compare the workers' variables first (eagerly); default True unless
            HVDKERAS_CHECK_MODELS=0.
        name: keyword only; the collectives' name, the same on every worker (hvdkeras's own broadcasts name
            theirs, so that they never meet a broadcast of the script's in the same step).

    Raises:
        ValueError: the workers' variables differ (see `check_same_variables`), or a bad root_rank.

    Example:
        >>> hvd.broadcast_variables(model.variables, root_rank=0)
        >>> hvd.broadcast_variables(optimizer.variables, root_rank=0)
    """
    _check_root_rank(root_rank)
    variables = list(variables)
    if check is None:
        check = settings.current().check_models
    if check and tf.executing_eagerly() and process_set is C.global_process_set:
        check_same_variables(variables)
    C.broadcast_variables([tf_variable(v) for v in variables], root_rank, process_set=process_set, name=name)


def broadcast_(variables: Iterable[Any], root_rank: int, name: str | None = None,
               process_set: Any = C.global_process_set) -> None:
    """Horovod's in-place broadcast of variables: every worker's `variables` take root_rank's values.

    `name` is accepted for Horovod's signature; the broadcast is named by its dtype, the same on every worker.
    """
    broadcast_variables(variables, root_rank, process_set=process_set, inplace=True)


broadcast_object = C.broadcast_object
allgather_object = C.allgather_object
