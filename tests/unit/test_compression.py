"""hvdkeras.compression: Horovod's compressors, by object or by name, and what they send."""

import pytest
import tensorflow as tf

from hvdkeras import compression
from hvdkeras.compression import Compression


def test_fp16_sends_floats_as_half_and_restores_their_dtype():
    for dtype in (tf.float32, tf.float64, tf.bfloat16):
        sent, ctx = Compression.fp16.compress(tf.ones(3, dtype))
        assert sent.dtype == tf.float16
        assert Compression.fp16.decompress(sent, ctx).dtype == dtype
    ints, ctx = Compression.fp16.compress(tf.ones(3, tf.int32))
    assert ints.dtype == tf.int32 and Compression.fp16.decompress(ints, ctx).dtype == tf.int32


def test_none_sends_as_is():
    t = tf.ones(2)
    sent, ctx = Compression.none.compress(t)
    assert sent is t and Compression.none.decompress(sent, ctx) is t


def test_by_name_and_back():
    assert compression.get("fp16") is Compression.fp16 and compression.get(Compression.none) is Compression.none
    assert compression.name_of(Compression.fp16) == "fp16"
    with pytest.raises(ValueError, match="Received: compression='gzip'"):
        compression.get("gzip")

    class Custom(compression.Compressor):
        pass

    assert compression.get(Custom) is Custom
    with pytest.raises(ValueError, match="cannot be serialized"):
        compression.name_of(Custom)
