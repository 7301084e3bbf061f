"""`import hvdkeras as hvd` in place of `import horovod.tensorflow as hvd`: every public name of
horovod.tensorflow is either in hvdkeras or refused with an error that names the alternative, and
docs/migrating.md gives each one's status. Read from the installed Horovod."""

import inspect
import re
from pathlib import Path

import pytest

import hvdkeras

horovod_tf = pytest.importorskip("horovod.tensorflow")
DOC = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"
NAMES = sorted(n for n in dir(horovod_tf) if not n.startswith("_") and not inspect.ismodule(getattr(horovod_tf, n)))
# Imported by horovod.tensorflow from the standard library, not Horovod's API.
NOT_HOROVODS = {"os", "tf", "warnings"}


def _documented() -> set[str]:
    section = DOC.read_text().split("## From horovod.tensorflow", 1)[1]
    return set(re.findall(r"`([A-Za-z_0-9]+)[`(]", section))


@pytest.mark.parametrize("name", [n for n in NAMES if n not in NOT_HOROVODS])
def test_every_horovod_tensorflow_name_is_here_or_says_what_to_use(name):
    if name in hvdkeras._INSTEAD:
        with pytest.raises(AttributeError, match=f"hvdkeras has no '{name}' \\(horovod.tensorflow.{name}\\): .+"):
            getattr(hvdkeras, name)
    else:
        assert hasattr(hvdkeras, name), f"hvdkeras lacks horovod.tensorflow.{name}"
    assert name in _documented(), f"docs/migrating.md does not give the status of {name}"


@pytest.mark.parametrize("name", ["Average", "Sum", "Min", "Max", "Product", "Adasum"])
def test_reduction_ops_have_horovods_values(name):
    assert getattr(hvdkeras, name) == getattr(horovod_tf, name)


@pytest.mark.parametrize("name", ["grouped_allreduce", "grouped_allgather", "grouped_reducescatter", "alltoall", "join",
                                  "rank_op", "local_rank_op", "size_op", "local_size_op", "process_set_included_op",
                                  "broadcast_", "broadcast_object_fn", "broadcast_variables", "is_homogeneous"])
def test_horovods_parameters_in_horovods_order(name):
    theirs = [p for p in inspect.signature(getattr(horovod_tf, name)).parameters]
    ours = [p for p in inspect.signature(getattr(hvdkeras, name)).parameters]
    assert ours[:len(theirs)] == theirs


def test_single_worker_results(hvd):
    import numpy as np
    import tensorflow as tf

    assert int(hvd.rank_op()) == 0 and int(hvd.size_op()) == 1
    assert int(hvd.local_rank_op()) == 0 and int(hvd.local_size_op()) == 1
    assert int(hvd.process_set_included_op()) == 1
    assert hvd.is_homogeneous() is True
    a, b = hvd.grouped_allreduce([tf.constant([1.0, 2.0]), tf.constant([3], tf.int32)], op=hvd.Sum)
    np.testing.assert_allclose(a, [1.0, 2.0])
    np.testing.assert_array_equal(b, [3])
    out, splits = hvd.alltoall(tf.constant([[1.0], [2.0]]), splits=[2])
    np.testing.assert_allclose(out, [[1.0], [2.0]])
    np.testing.assert_array_equal(splits, [2])
    np.testing.assert_allclose(hvd.alltoall(tf.constant([5.0])), [5.0])
    np.testing.assert_allclose(hvd.grouped_allgather([tf.constant([1.0])])[0], [1.0])
    np.testing.assert_allclose(hvd.grouped_reducescatter([tf.constant([1.0, 2.0])])[0], [1.0, 2.0])
    np.testing.assert_allclose(hvd.reducescatter(tf.constant([4.0, 6.0]), op=hvd.Sum), [4.0, 6.0])
    assert hvd.broadcast_object_fn(root_rank=0)({"a": 1}) == {"a": 1}
    v = tf.Variable([1.0])
    hvd.broadcast_([v], 0)
    np.testing.assert_allclose(v.numpy(), [1.0])
    assert hvd.gpu_available("tensorflow") is False
    with pytest.raises(ValueError, match="Received: ext_base_name='torch'"):
        hvd.gpu_available("torch")
