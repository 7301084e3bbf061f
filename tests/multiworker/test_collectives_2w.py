"""Real 2-worker Gloo runs of the basic collectives."""

import numpy as np

SCENARIOS = ("collectives",)  # run in the one scenarios launch (conftest.py), as `job`


def test_topology(job):
    for rank in (0, 1):
        r = job.results[rank]
        assert (r["rank"], r["size"], r["local_rank"], r["local_size"]) == (rank, 2, rank, 2)
        assert (r["cross_rank"], r["cross_size"]) == (0, 1)


def test_textbook_average(job):
    for rank in (0, 1):
        np.testing.assert_allclose(job.results[rank]["average"], [0.3, -0.05, 0.4], rtol=0, atol=1e-7)


def test_sum(job):
    for rank in (0, 1):
        np.testing.assert_allclose(job.results[rank]["sum"], [0.6, -0.1, 0.8], rtol=0, atol=1e-7)


def test_fp16_compression_restores_dtype(job):
    for rank in (0, 1):
        assert job.results[rank]["fp16_dtype"] == "<dtype: 'float32'>"
        np.testing.assert_allclose(job.results[rank]["fp16_average"], [0.3, -0.05, 0.4], rtol=1e-3, atol=1e-3)


def test_broadcast_from_each_root(job):
    for rank in (0, 1):
        assert job.results[rank]["broadcast_from_0"] == [1.0, 0.0]
        assert job.results[rank]["broadcast_from_1"] == [2.0, 10.0]


def test_broadcast_keras_variables(job):
    for rank in (0, 1):
        r = job.results[rank]
        assert r["keras_vars_from_1"][0] == [[2.0] * 3] * 2
        assert r["keras_vars_from_1"][1] == [0, 2, 4, 6]
        assert r["model_kernel_from_0"] == [[0.0, 0.0]] * 3


def test_allgather_uneven_first_dimension(job):
    for rank in (0, 1):
        assert job.results[rank]["allgather"] == [[0, 0], [1, 1], [1, 1]]
