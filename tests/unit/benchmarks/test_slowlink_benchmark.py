"""The slow-link benchmark's arithmetic: the target, time to target, bytes after the exact start, the ratios, and
its command line. The runs themselves: `make slowbench` (docs/slow_links.md)."""

import pytest

from . import load

sl = load("slowlink_benchmark")


def rank(variants):
    return {"variants": variants}


def run(curve, tx, steps=100, step_ms=10.0, train_s=None):
    return {"curve": [{"step": s, "train_s": t, "accuracy": a} for s, t, a in curve], "tx_bytes": tx,
            "steps": steps, "step_ms": step_ms, "train_s": train_s or curve[-1][1]}


def test_time_to_target_ratios_and_bytes_after_the_exact_start():
    exact = run([(50, 10.0, 0.80), (100, 20.0, 0.900)], tx=100 * 1000)
    psgd = run([(50, 2.0, 0.86), (100, 4.0, 0.897)], tx=20 * 1000 + 80 * 10)
    dead = run([(50, 1.0, 0.5), (100, 2.0, 0.6)], tx=500)
    ranks = [rank({"exact": exact, "powersgd_r1": psgd, "diloco_h8": dead})] * 2
    out = sl.summarize(ranks)
    assert out["target_accuracy"] == pytest.approx(0.895)
    v = out["variants"]
    assert v["exact"]["time_to_target_s"] == 20.0 and v["powersgd_r1"]["time_to_target_s"] == 4.0
    assert v["powersgd_r1"]["time_to_target_vs_exact"] == pytest.approx(0.2)
    assert v["diloco_h8"]["time_to_target_s"] is None and v["diloco_h8"]["time_to_target_vs_exact"] is None
    assert v["exact"]["bytes_per_step"] == 2000  # both hosts' counters
    # 20 exact steps at the exact run's 2,000 bytes, then 80 steps at 20 bytes.
    assert v["powersgd_r1"]["bytes_per_step_after_start"] == pytest.approx(20)
    assert v["powersgd_r1"]["accuracy_gap_points"] == pytest.approx(-0.3)
    table = sl.table("50mbit", out)
    assert "100.0x fewer" in table and "not reached" in table


def test_the_exact_run_comes_first_and_sets_the_target():
    with pytest.raises(ValueError, match="exact"):
        sl.summarize([rank({"fp16": run([(1, 1.0, 0.5)], 10)})] * 2)
    with pytest.raises(SystemExit):
        sl.main(["--variants", "fp16,exact"])
