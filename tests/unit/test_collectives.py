"""hvdkeras.collectives in one process: the user collectives' arguments and results, and the model checks' messages."""

import keras
import numpy as np
import pytest

from hvdkeras import collectives, settings


@pytest.mark.parametrize("op", [7, "average", True])
def test_bad_op(hvd, op):
    with pytest.raises(ValueError, match="Received: op="):
        hvd.allreduce([1.0], op=op)


def test_tensor_ops_beyond_average_and_sum_as_in_horovod(hvd):
    for op in (hvd.Min, hvd.Max, hvd.Product):
        np.testing.assert_allclose(hvd.allreduce([1.5, -2.0], op=op).numpy(), [1.5, -2.0])
    with pytest.raises(ValueError, match="Adasum needs Horovod's MPI build.*use op=hvdkeras.Average. "
                                         "Received: op=Adasum"):
        hvd.allreduce([1.0], op=hvd.Adasum)
    with pytest.raises(ValueError, match="must be hvdkeras.Average or hvdkeras.Sum. Received: op=Max"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Max)  # gradients: Average or Sum only


def test_op_and_deprecated_average_follow_horovod(hvd):
    from hvdkeras.collectives import op_from

    assert op_from(None, None) == hvd.Average and op_from(True, None) == hvd.Average
    assert op_from(False, None) == hvd.Sum and op_from(None, hvd.Sum) == hvd.Sum
    with pytest.raises(ValueError, match="not both. Received: average=True, op=1"):
        hvd.allreduce([1.0], average=True, op=hvd.Sum)
    np.testing.assert_allclose(hvd.allreduce([2.0], None, False).numpy(), [2.0])  # Horovod's positional order


def test_broadcast_global_variables_says_what_to_use(hvd):
    with pytest.raises(RuntimeError, match="BroadcastGlobalVariablesCallback"):
        hvd.broadcast_global_variables(0)


def test_bad_compression(hvd):
    with pytest.raises(ValueError, match="Received: compression="):
        hvd.allreduce([1.0], compression="zip")


@pytest.mark.parametrize("root", [-1, 1, 2])
def test_bad_root_rank(hvd, root):
    with pytest.raises(ValueError, match="Received: root_rank="):
        hvd.broadcast([1.0], root_rank=root)


def test_single_worker_collectives(hvd):
    import numpy as np

    assert hvd.size() == 1 and hvd.rank() == 0
    np.testing.assert_allclose(hvd.allreduce([0.2, -0.1]).numpy(), [0.2, -0.1])
    v = keras.Variable([1.0, 2.0])
    hvd.broadcast_variables([v], root_rank=0)
    np.testing.assert_allclose(v.numpy(), [1.0, 2.0])
    with pytest.raises(TypeError, match="keras.Variable or tf.Variable"):
        hvd.broadcast_variables([np.zeros(2)])


def test_check_models_variable_is_read_as_a_boolean(hvd, monkeypatch):

    v = keras.Variable([1.0, 2.0])
    for value in ("0", "off", "1", "yes", ""):
        monkeypatch.setenv("HVDKERAS_CHECK_MODELS", value)
        settings.use(None)  # each value as a process started with it reads it
        hvd.broadcast_variables([v], root_rank=0)
    monkeypatch.setenv("HVDKERAS_CHECK_MODELS", "maybe")
    settings.use(None)
    with pytest.raises(ValueError, match="HVDKERAS_CHECK_MODELS must be one of .*Received: "
                                         "HVDKERAS_CHECK_MODELS='maybe'"):
        hvd.broadcast_variables([v], root_rank=0)


def test_mismatch_message_names_the_first_differing_variable():
    rank0 = [("dense/kernel", (6, 8), "float32"), ("dense/bias", (8,), "float32")]
    rank1 = [("dense/kernel", (6, 9), "float32"), ("dense/bias", (9,), "float32")]
    message = collectives._mismatch_message([rank0, rank1])
    assert "variable #0" in message
    assert "rank 0 has 'dense/kernel' shape=(6, 8) dtype=float32" in message
    assert "rank 1 has 'dense/kernel' shape=(6, 9) dtype=float32" in message
    extra = rank0 + [("dense_1/kernel", (8, 3), "float32")]
    message = collectives._mismatch_message([rank0, extra])
    assert "variable #2: rank 0 has nothing, rank 1 has 'dense_1/kernel'" in message
    assert "rank 0 has 2 variables, rank 1 has 3" in message
