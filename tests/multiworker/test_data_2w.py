"""fit() on sharded data with 2 real workers: no hang, equal steps, disjoint shards that cover the data."""

import pytest

SCENARIOS = ("data",)  # run in the one scenarios launch (conftest.py), as `job`


@pytest.mark.parametrize("name", ["known", "unknown"])
def test_97_elements_batched_by_8(job, name):
    a, b = job.results[0][name], job.results[1][name]
    assert a["steps"] == b["steps"] == 3 * 6  # 48 elements each: 6 batches (5 full + one of 8)
    for epoch in range(3):
        seen0, seen1 = set(a["seen"][epoch]), set(b["seen"][epoch])
        assert len(seen0) == len(seen1) == 48
        assert not seen0 & seen1
        assert len(seen0 | seen1) == 96 and (seen0 | seen1) <= set(range(97))


def test_seeded_order_changes_each_epoch(job):
    seen = job.results[0]["known"]["seen"]
    assert seen[0] != seen[1]


def test_file_sharding(job):
    a, b = job.results[0]["files"], job.results[1]["files"]
    assert a["steps"] == b["steps"]
    files0 = {v // 100 for v in a["seen"][0]}
    files1 = {v // 100 for v in b["seen"][0]}
    assert not files0 & files1 and files0 | files1 == set(range(5))
    assert len(a["seen"][0]) == len(b["seen"][0])
