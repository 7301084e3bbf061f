"""The explicit API inside a tf.distribute strategy's scope on 2 real Gloo workers (one launch)."""

import pytest

SCENARIOS = ("strategy",)  # run in the one scenarios launch (conftest.py), as `job`


def test_distributed_optimizer_in_a_mirrored_strategy_trains_as_one_process(job):
    for r in (0, 1):
        res = job.results[r]
        assert res["strategy"] == "MirroredStrategy" and res["replicas"] == 1  # this process's one device
        assert res["lr_variable"] == "MirroredVariable"
        assert res["vs_one_process"] <= 1e-5, f"rank {r}: {res['vs_one_process']}"
        assert res["lr_after_warmup"] == pytest.approx(2e-2)
    assert job.results[0]["digest"] == job.results[1]["digest"]
    assert job.results[0]["second_digest"] == job.results[1]["second_digest"]
    print(f"explicit API in a MirroredStrategy: max abs diff to one process {job.results[0]['vs_one_process']:.1e}")
