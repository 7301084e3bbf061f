"""benchmarks/loop_benchmark.py: a variant's step (per round the slower worker, then the median over rounds),
and the ratios it publishes, over recorded worker results."""

import pytest

from . import load


@pytest.fixture
def bench():
    return load("loop_benchmark")


def test_a_step_is_the_slower_workers_median_over_rounds(bench):
    ranks = [{"rounds_s": {"fit": [0.10, 0.30, 0.12]}}, {"rounds_s": {"fit": [0.11, 0.20, 0.13]}}]
    assert bench.steps(ranks) == {"fit": pytest.approx(0.13)}  # max per round: 0.11, 0.30, 0.13


def test_the_ratios_are_to_fit_and_to_horovods_keras2_tape_loop(bench):
    k3 = {"fit": 0.100, "tape": 0.102, "unmodified": 0.105, "horovod_tape": 0.110}
    k2 = {"horovod_fit_keras2": 0.090, "horovod_tape_keras2": 0.120}
    row = bench.summarize(k3, k2)
    assert row["step_ms"]["tape"] == 102.0 and row["step_ms"]["horovod_tape_keras2"] == 120.0
    assert row["over_fit"] == {"tape": 1.02, "unmodified": 1.05, "horovod_tape": 1.1}
    assert row["over_horovod_tape_keras2"] == {"fit": 0.833, "tape": 0.85, "unmodified": 0.875}


def test_bad_arguments_are_refused_before_anything_runs(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--steps", "1"])
    assert "Received: --steps 1 --rounds 4" in capsys.readouterr().err
