"""benchmarks/sharding_benchmark.py: the largest-model search and the table's ratios, with the launches faked."""

import pytest

from . import load


@pytest.fixture
def bench(monkeypatch, tmp_path):
    module = load("sharding_benchmark")
    made = []
    monkeypatch.setattr(module, "_cgroups", lambda limit, n: made.append((limit, n)) or str(tmp_path / "cg"))
    monkeypatch.setattr(module, "_remove_cgroups", lambda base, n: made.append(("removed", n)))
    module.made = made
    return module


def fake_run(max_width):
    """A job that trains when the width is at most max_width, and is killed (None) above it."""

    def run(n, width, shard, steps, cgroup=None, timeout=600):
        if width > max_width:
            return None
        return [{"params": 8 * width * width, "peak_rss_bytes": width, "loss_finite": True} for _ in range(n)]

    return run


@pytest.mark.parametrize("max_width", [1024, 2304, 3840, 10240])
def test_largest_model_bisects_to_the_widest_that_trains(bench, monkeypatch, max_width):
    monkeypatch.setattr(bench, "run", fake_run(max_width))
    best = bench.largest_model(2.5, shard=True)
    assert best["width"] == max_width and best["params"] == 8 * max_width ** 2
    assert bench.made == [(int(2.5 * 2**30), 2), ("removed", 2)]  # the cgroups are removed afterwards


def test_largest_model_when_nothing_fits(bench, monkeypatch):
    monkeypatch.setattr(bench, "run", fake_run(0))
    assert bench.largest_model(0.5, shard=False) == {"width": None, "params": 0}
    assert bench.made[-1] == ("removed", 2)


def test_the_cgroups_are_removed_when_a_launch_raises(bench, monkeypatch):
    def broken(*args, **kwargs):
        raise SystemExit("boom")

    monkeypatch.setattr(bench, "run", broken)
    with pytest.raises(SystemExit):
        bench.largest_model(2.5, shard=True)
    assert bench.made[-1] == ("removed", 2)
