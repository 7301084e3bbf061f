"""hvdkeras.job.lifecycle: GPU pinning (over faked device lists) and the Horovod settings added across hosts."""

import pytest

from hvdkeras.job import lifecycle


class FakeConfig:
    """tf.config's device calls over a faked list of GPUs; `visible` is what the process was told to see."""

    def __init__(self, gpus, fail=False, visible=None):
        self.gpus = gpus
        self.visible = None
        self.already_visible = list(gpus) if visible is None else visible
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

    def get_visible_devices(self, kind):
        assert kind == "GPU"
        return list(self.already_visible)

    def set_visible_devices(self, device, kind):
        if self.fail:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.visible = (device, kind)


FOUR = ["GPU:0", "GPU:1", "GPU:2", "GPU:3"]


@pytest.mark.parametrize("local_rank, expected", [(0, "GPU:0"), (1, "GPU:1"), (3, "GPU:3")])
def test_pin_gpu_by_local_rank(local_rank, expected):
    config = FakeConfig(FOUR)
    assert lifecycle.pin_gpu(local_rank, 4, config=config, environ={}) == expected
    assert config.visible == (expected, "GPU")
    assert config.growth == [(expected, True)]


def test_more_processes_on_a_host_than_gpus_is_refused():
    with pytest.raises(ValueError, match=r"6 processes on this host but 4 GPUs.*Received: local size 6"):
        lifecycle.pin_gpu(5, 6, config=FakeConfig(FOUR), environ={})


@pytest.mark.parametrize("how", ["CUDA_VISIBLE_DEVICES", "tf.config"])
def test_a_process_that_chose_its_gpu_is_left_alone(how, caplog):
    """Slurm's GPU binding gives each task one GPU in CUDA_VISIBLE_DEVICES; a script may choose before init."""
    if how == "CUDA_VISIBLE_DEVICES":
        config, environ = FakeConfig(["GPU:0"]), {"CUDA_VISIBLE_DEVICES": "2"}
    else:
        config, environ = FakeConfig(FOUR, visible=["GPU:2"]), {}
    with caplog.at_level("INFO", logger="hvdkeras"):
        assert lifecycle.pin_gpu(3, 4, config=config, environ=environ) is None
    assert config.visible is None and "left as they are" in caplog.text


def test_pin_gpu_on_several_visible_devices_pins_by_local_rank():
    config = FakeConfig(["GPU:0", "GPU:1"])
    assert lifecycle.pin_gpu(1, 2, config=config, environ={"CUDA_VISIBLE_DEVICES": "4,5"}) == "GPU:1"


@pytest.mark.parametrize("cuda", [True, False])
def test_pin_gpu_without_gpus_trains_on_cpu_and_a_cuda_build_says_so_once(cuda, caplog, monkeypatch):
    monkeypatch.setattr(lifecycle, "_said_no_gpu", [])
    config = FakeConfig([])
    for _ in range(2):
        assert lifecycle.pin_gpu(0, 1, config=config, environ={}, built_with_cuda=cuda) is None
    assert config.visible is None
    assert caplog.text.count("CUDA build but sees no GPU") == (1 if cuda else 0)


def test_pin_gpu_after_runtime_init_warns(caplog):
    config = FakeConfig(["GPU:0", "GPU:1"], fail=True)
    assert lifecycle.pin_gpu(1, 2, config=config, environ={}) == "GPU:1"
    assert "could not pin GPU" in caplog.text


@pytest.mark.parametrize("environ, expected", [
    ({"HOROVOD_CROSS_SIZE": "2"}, {"HOROVOD_CYCLE_TIME": "5"}),   # across hosts
    ({"HOROVOD_CROSS_SIZE": "1"}, {}),                            # one host: Horovod's 1 ms
    ({}, {}),
    ({"HOROVOD_CROSS_SIZE": "4", "HOROVOD_CYCLE_TIME": "0.5"}, {}),  # the user's (or horovodrun's) value stays
    ({"HOROVOD_CROSS_SIZE": "x"}, {}),
])
def test_horovod_cycle_time_is_5_ms_only_across_hosts_and_only_when_unset(environ, expected):
    assert lifecycle.horovod_defaults(environ) == expected
