"""The stall benchmark's percentiles and its slow-mode test: a run whose mean step hid nothing."""

import pytest

from . import load

sb = load("stall_benchmark")


def test_percentiles_and_slow_runs_follow_their_definitions():
    fast = [0.30] * 19 + [0.90]  # one long step in a fast run
    slow = [0.45] * 20  # above t_local + t_comm = 0.40 s: compute and communication one after the other
    row = sb.summarize([{"t_local": 0.15, "t_comm": 0.25, "runs": [fast, fast, slow]}, {}])
    assert row["steps"] == 60 and row["median_ms"] == pytest.approx(300.0)
    assert row["max_ms"] == pytest.approx(900.0) and row["over_3x_median"] == 0
    assert row["no_overlap_bound_ms"] == pytest.approx(400.0)
    assert row["run_means_ms"] == pytest.approx([330.0, 330.0, 450.0])
    assert row["slow_runs"] == 1
    assert row["p99_ms"] > row["p90_ms"] >= 450.0 - 1e-9
    assert row["p99_over_median"] == pytest.approx(row["p99_ms"] / 300.0)


def test_bad_options_say_what_was_received(capsys):
    with pytest.raises(SystemExit):
        sb.main(["--competing", "one"])
    assert "--competing takes counts >= 0, comma-separated. Received: 'one'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sb.main(["--runs", "0"])
    assert "Received: --runs 0 --steps 20" in capsys.readouterr().err


def test_hand_overs_compare_the_ranks_orders_on_one_clock():
    # Two steps of one run: in the first both ranks hand buckets 0, 1, 2 over in that order; in the second rank 1
    # hands them over reversed, so no bucket is on both ranks until 20 ms after the first hand-over.
    r0 = {"stamps": [[[10.000, 10.010, 10.020], [20.000, 20.010, 20.020]]], "orders": [["012", "012"]]}
    r1 = {"stamps": [[[10.002, 10.012, 10.022], [20.030, 20.020, 20.000]]], "orders": [["012", "210"]]}
    out = sb.handovers([r0, r1])
    assert out["same_order_share"] == [0.5]
    assert out["wait_for_both_ms"] == pytest.approx([(2.0 + 20.0) / 2])
    assert out["orders"][0][0] == "012" and out["orders"][0][1] in ("012", "210")  # a tie: either
