"""Synchronized batch normalization on 2 real Gloo workers equals plain batch norm on the global batch."""

import pytest

SCENARIOS = ("syncbn",)  # run in the one scenarios launch (conftest.py), as `job`


@pytest.mark.parametrize("kind", ["sync_layer", "keras_synchronized"])
def test_two_workers_of_8_rows_equal_one_batch_of_16(job, kind):
    for r in (0, 1):
        assert job.results[r][f"{kind}_max_abs_diff"] <= 1e-5
        assert job.results[r][f"{kind}_moving_diff"] <= 1e-5
        print(f"{kind} rank {r}: weights {job.results[r][f'{kind}_max_abs_diff']:.1e}, "
              f"moving stats {job.results[r][f'{kind}_moving_diff']:.1e}")


def test_uneven_batches_get_the_global_mean_and_variance(job):
    for r in (0, 1):
        assert job.results[r]["uneven_output_diff"] <= 1e-5
        assert job.results[r]["uneven_moving_diff"] <= 1e-5
