"""DistributedGradientTape and Horovod's TF2 loop on 2 real Gloo workers (workers/tape_worker.py)."""

import numpy as np

SCENARIOS = ("tape",)  # run in the one scenarios launch (conftest.py), as `job`
TOL = 1e-6


def both(job, key):
    return [job.results[r][key] for r in (0, 1)]


def test_tape_gradients_equal_one_process_on_the_global_batch(job):
    assert max(both(job, "eager_grad_diff")) <= TOL
    assert max(both(job, "traced_grad_diff")) <= TOL


def test_indexed_slices_are_allgathered_and_averaged(job):
    assert both(job, "sparse_is_indexed_slices") == [True, True]
    for dense in both(job, "sparse_dense"):
        np.testing.assert_allclose(dense, [0.5, 0.5, 1.0, 1.0, 0.0, 0.0])


def test_partial_tape_keeps_local_gradients_and_averages_the_rest(job):
    assert max(both(job, "local_kernel_diff")) <= TOL
    assert max(both(job, "shared_kernel_diff")) <= TOL


def test_tape_and_distributed_optimizer_reduce_once(job):
    for value in both(job, "once_value"):
        np.testing.assert_allclose(value, [-2.0, -2.0])


def test_horovods_tf2_loop_trains_one_model_from_different_initial_weights(job):
    assert both(job, "initial_differs") == [True, True]
    a, b = both(job, "loop_digest")
    assert a == b
    a, b = both(job, "loop_opt_digest")
    assert a == b


def test_seeded_horovod_loop_equals_one_process(job):
    print(f"seeded tape loop: max abs weight difference from one process {max(both(job, 'seeded_loop_diff')):.1e}")
    assert max(both(job, "seeded_loop_diff")) <= 1e-5
