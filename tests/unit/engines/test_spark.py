"""hvdkeras.spark.run's checks, in one process (the real Spark runs are in tests/multiworker/test_spark_2w.py)."""

import pytest

import hvdkeras.spark as spark


@pytest.mark.parametrize("kwargs, message", [
    ({"use_mpi": True}, "forms a Gloo job; MPI is not used. Received: use_mpi=True"),
    ({"use_gloo": False}, "Received: use_gloo=False"),
    ({"extra_mpi_args": "-x A"}, "uses no MPI. Received: extra_mpi_args='-x A'"),
    ({"nics": ["eth0", "eth1"]}, "one network interface for Gloo. Received: nics=['eth0', 'eth1']"),
])
def test_bad_arguments_say_what_was_received(kwargs, message):
    with pytest.raises(ValueError) as err:
        spark.run(print, **kwargs)
    assert message in str(err.value)


def test_no_active_spark_context_is_a_clear_error():
    with pytest.raises(RuntimeError, match="needs an active SparkContext"):
        spark.run(print, num_proc=2)


class FakeContext:
    defaultParallelism = 2

    class _Conf:
        def get(self, name, default=None):
            return {"spark.task.cpus": "1"}.get(name, default)

    def getConf(self):  # noqa: N802 - Spark's name
        return self._Conf()


def test_more_processes_than_slots_fails_after_the_start_timeout():
    spark._wait_for_slots(FakeContext(), 2, start_timeout=0)  # enough: returns at once
    with pytest.raises(ValueError, match="asked for 3 processes, but this Spark cluster has 2 task slots"):
        spark._wait_for_slots(FakeContext(), 3, start_timeout=0.2)


def test_one_nic():
    assert spark._one_nic(None) is None
    assert spark._one_nic("eth0") == spark._one_nic({"eth0"}) == "eth0"
