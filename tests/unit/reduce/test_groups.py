"""hvdkeras.reduce.groups: the buckets, even and listed groups, and the split by dtype."""

import keras
import numpy as np


def test_even_and_listed_groups():
    from hvdkeras.reduce.groups import even_groups, listed_groups

    assert even_groups([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert even_groups([0, 1], 5) == [[0], [1]]
    variables = [keras.Variable(np.zeros(2, "float32")) for _ in range(4)]
    listed = [[variables[3], variables[1]]]
    assert listed_groups([0, 1, 2, 3], variables, listed) == [[1, 3], [0], [2]]


def test_each_group_is_split_by_dtype_and_buckets_follow_the_backward_pass():
    from hvdkeras.reduce.groups import dense_groups, gradient_buckets
    from hvdkeras.reduce.options import ReductionOptions

    variables = [keras.Variable(np.zeros(4, dtype)) for dtype in ("float32", "float16", "float32")]
    assert dense_groups([0, 1, 2], variables, ReductionOptions(bucket_bytes=0)) == [[0, 2], [1]]
    # 16, 8 and 16 bytes from the last variable back: a bucket closes at 20 bytes or more.
    assert gradient_buckets([0, 1, 2], variables, 20) == [[2, 1], [0]]
    assert gradient_buckets([], variables, 20) == []
