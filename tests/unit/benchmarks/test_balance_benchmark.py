"""benchmarks/balance_benchmark.py: the step-time table's figures from the workers' rounds, with no job run."""

import pytest

from . import load

WAYS = ("unsharded", "whole", "pieces", "ungathered")


def rank(r, rounds):
    return {"rank": r, "size": 2, "model": "mlp", "batch": 32, "steps": 60, "rounds": rounds}


@pytest.fixture
def bench():
    return load("balance_benchmark")


def test_step_row_takes_the_slowest_rank_of_each_round_and_pairs_the_rounds(bench):
    # Round 2 ran on a machine twice as slow: the paired ratios do not see it.
    r0 = rank(0, {"unsharded": [0.010, 0.020], "whole": [0.011, 0.022], "pieces": [0.012, 0.024],
                  "ungathered": [0.009, 0.018]})
    r1 = rank(1, {"unsharded": [0.010, 0.019], "whole": [0.011, 0.021], "pieces": [0.013, 0.023],
                  "ungathered": [0.009, 0.018]})
    row = bench.step_row([r0, r1])
    assert row["step_seconds_rounds"]["pieces"] == [0.013, 0.024]  # each round's slowest rank
    assert row["step_seconds"]["pieces"] == 0.013  # the fastest round
    assert row["ratio_to_unsharded_rounds"]["pieces"] == pytest.approx([1.3, 1.2])
    assert row["ratio_to_unsharded_median"]["pieces"] == pytest.approx(1.25)
    assert row["ratio_to_unsharded_median"]["whole"] == pytest.approx(1.1)
    assert row["ratio_to_unsharded_median"]["ungathered"] == pytest.approx(0.9)
    assert row["pieces_within_goal"] is False
    # (pieces - ungathered) / pieces, round by round: 4/13 and 6/24.
    assert row["allgather_share_median"] == pytest.approx((4 / 13 + 6 / 24) / 2)
    assert (row["model"], row["workers"], row["batch"]) == ("mlp", 2, 32)


def test_step_row_within_the_goal_at_ten_percent(bench):
    rounds = {"unsharded": [0.010] * 3, "whole": [0.0105] * 3, "pieces": [0.0105, 0.0108, 0.0107],
              "ungathered": [0.010] * 3}
    assert bench.step_row([rank(0, rounds), rank(1, rounds)])["pieces_within_goal"] is True
    rounds["pieces"] = [0.0112] * 3
    assert bench.step_row([rank(0, rounds), rank(1, rounds)])["pieces_within_goal"] is False
