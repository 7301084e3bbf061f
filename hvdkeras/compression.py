"""Gradient compression applied around the allreduce (same interface as Horovod's)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class Compressor:
    """Compresses a tensor before it is sent and restores it afterwards."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 and casts them back to their dtype on arrival."""

    @staticmethod
    def compress(tensor):
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            return tf.cast(tensor, tf.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and tensor.dtype != ctx:
            return tf.cast(tensor, ctx)
        return tensor


class Compression:
    """The available compressors: `Compression.none` and `Compression.fp16`.

    Example:
        >>> opt = hvdkeras.DistributedOptimizer(opt, compression=hvdkeras.Compression.fp16)
    """

    none = NoneCompressor
    fp16 = FP16Compressor


_BY_NAME = {"none": NoneCompressor, "fp16": FP16Compressor}


def get(compression: Any) -> type[Compressor]:
    """Returns the compressor class for `compression` (a Compression member or its name).

    Raises:
        ValueError: an unknown compression.
    """
    if isinstance(compression, str) and compression in _BY_NAME:
        return _BY_NAME[compression]
    if isinstance(compression, type) and issubclass(compression, Compressor):
        return compression
    raise ValueError(
        "`compression` must be hvdkeras.Compression.none, hvdkeras.Compression.fp16 or one of "
        f"{sorted(_BY_NAME)}. Received: compression={compression!r}"
    )


def name_of(compressor: type[Compressor]) -> str:
    for name, cls in _BY_NAME.items():
        if cls is compressor:
            return name
    raise ValueError(f"Custom compressors cannot be serialized. Received: compression={compressor!r}")
