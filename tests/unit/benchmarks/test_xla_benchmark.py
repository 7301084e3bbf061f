"""benchmarks/xla_benchmark.py: the link rate that makes communication about as long as the compute, and the
summary's step (the slowest worker's) and ratio, over recorded worker results."""

import pytest

from . import load


@pytest.fixture
def bench():
    return load("xla_benchmark")


def ranks(kept_ms, off_ms, kept=(True, True)):
    return [{"models": {"mlp": {"step_s": {"kept": k / 1e3, "off": o / 1e3}, "kept": flag}}}
            for k, o, flag in zip(kept_ms, off_ms, kept)]


def test_the_host_rate_makes_the_allreduce_as_long_as_the_step(bench):
    # 15,859,752 bytes of gradients (the MLP) in a 50 ms step: 2537.6 Mbit/s.
    assert bench.host_rate(15_859_752, 0.05) == "2538mbit"
    assert bench.host_rate(1000, 10.0) == "1mbit"  # never 0


def test_the_summary_takes_the_slowest_worker_and_says_whether_xla_was_kept(bench):
    row = bench.summary(ranks([40, 44], [50, 48]))["mlp"]
    assert row["step_s"] == {"kept": 0.044, "off": 0.050}
    assert row["kept_over_off"] == pytest.approx(0.88)
    assert row["kept"] is True
    assert bench.summary(ranks([40, 44], [50, 48], kept=(True, False)))["mlp"]["kept"] is False
