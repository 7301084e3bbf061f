"""init's GPU pinning (with a faked device list), validation of collective arguments."""

import pytest

from hvdkeras import basics


class FakeConfig:
    def __init__(self, gpus, fail=False):
        self.gpus = gpus
        self.visible = None
        self.growth = []
        self.fail = fail
        outer = self

        class Experimental:
            @staticmethod
            def set_memory_growth(device, enable):
                outer.growth.append((device, enable))

        self.experimental = Experimental()

    def list_physical_devices(self, kind):
        assert kind == "GPU"
        return list(self.gpus)

    def set_visible_devices(self, device, kind):
        if self.fail:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.visible = (device, kind)


@pytest.mark.parametrize("local_rank, expected", [(0, "GPU:0"), (1, "GPU:1"), (2, "GPU:2"), (5, "GPU:1")])
def test_pin_gpu_by_local_rank(local_rank, expected):
    config = FakeConfig(["GPU:0", "GPU:1", "GPU:2", "GPU:3"][: 4 if local_rank < 4 else 2])
    assert basics.pin_gpu(local_rank, config=config) == expected
    assert config.visible == (expected, "GPU")
    assert config.growth == [(expected, True)]


def test_pin_gpu_without_gpus_does_nothing():
    config = FakeConfig([])
    assert basics.pin_gpu(0, config=config) is None
    assert config.visible is None


def test_pin_gpu_after_runtime_init_warns(caplog):
    config = FakeConfig(["GPU:0", "GPU:1"], fail=True)
    assert basics.pin_gpu(1, config=config) == "GPU:1"
    assert "could not pin GPU" in caplog.text


@pytest.mark.parametrize("op", [3, "average", None, True])
def test_bad_op(hvd, op):
    with pytest.raises(ValueError, match="Received: op="):
        hvd.allreduce([1.0], op=op)


def test_bad_compression(hvd):
    with pytest.raises(ValueError, match="Received: compression="):
        hvd.allreduce([1.0], compression="zip")


@pytest.mark.parametrize("root", [-1, 1, 2])
def test_bad_root_rank(hvd, root):
    with pytest.raises(ValueError, match="Received: root_rank="):
        hvd.broadcast([1.0], root_rank=root)


def test_single_worker_collectives(hvd):
    import keras
    import numpy as np

    assert hvd.size() == 1 and hvd.rank() == 0
    np.testing.assert_allclose(hvd.allreduce([0.2, -0.1]).numpy(), [0.2, -0.1])
    v = keras.Variable([1.0, 2.0])
    hvd.broadcast_variables([v], root_rank=0)
    np.testing.assert_allclose(v.numpy(), [1.0, 2.0])
    with pytest.raises(TypeError, match="keras.Variable or tf.Variable"):
        hvd.broadcast_variables([np.zeros(2)])
