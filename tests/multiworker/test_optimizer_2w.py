"""DistributedOptimizer on 2 real Gloo workers equals one process training on the global batches."""

import pytest

TOL = 1e-5


SCENARIOS = ("optimizer", "resume")  # run in the one scenarios launch (conftest.py)


def both(job, key):
    return [job.results[r][key] for r in (0, 1)]


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_equivalent_to_single_worker_on_global_batches(job, kind):
    print(f"{kind}: max abs weight difference from one process {max(both(job, f'{kind}_max_abs_diff')):.1e}")
    for diff in both(job, f"{kind}_max_abs_diff"):
        assert diff <= TOL


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw", "fp16", "bpps2", "mp", "xla_bpps2", "xla_mp"])
def test_ranks_hold_bit_identical_weights(job, kind):
    a, b = both(job, f"{kind}_digest")
    assert a == b


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_one_fused_allreduce_per_bucket_and_step(job, kind):
    assert both(job, "buckets_per_step") == [2, 2]
    assert both(job, f"{kind}_calls_per_step") == [2.0, 2.0]


def test_bucket_bytes_0_is_one_allreduce_after_the_backward_pass(job):
    assert both(job, "single_calls_per_step") == [1.0, 1.0]
    assert max(both(job, "single_max_abs_diff")) <= TOL


def test_groups_split_the_fused_allreduce(job):
    assert both(job, "groups2_calls_per_step") == [2.0, 2.0]
    assert max(both(job, "groups2_max_abs_diff")) <= TOL


def test_fp16_compression_within_one_percent(job):
    print(f"fp16: max relative weight difference from one process {max(both(job, 'fp16_max_rel_diff')):.1e}")
    assert max(both(job, "fp16_max_rel_diff")) <= 1e-2


def test_sum_op(job):
    assert max(both(job, "sum_max_abs_diff")) <= TOL


def test_gradient_predivide_factor(job):
    assert max(both(job, "predivide_max_abs_diff")) <= TOL


def test_backward_passes_per_step_communicates_every_k_steps(job):
    # Its 2 buckets every second step.
    assert both(job, "bpps2_calls_per_step") == [1.0, 1.0]
    assert both(job, "bpps2_iterations") == [10, 10]  # backward passes, as in Horovod
    assert max(both(job, "bpps2_max_abs_diff")) <= TOL


def test_custom_training_loops(job):
    assert max(both(job, "custom_apply_gradients_max_abs_diff")) <= TOL
    assert max(both(job, "custom_apply_max_abs_diff")) <= TOL


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_embedding_gradients(job, sparse_as_dense):
    assert max(both(job, f"sparse_as_dense_{sparse_as_dense}_max_abs_diff")) <= TOL


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_xla_kept_for_the_compute_trains_as_keras_compiled_step_on_global_batches(job, kind):
    """jit_compile=True: the forward and backward pass compiled with XLA, the gradients reduced outside, in
    their 2 buckets; equal to one process running Keras's compiled step, with bit-identical ranks."""
    print(f"xla {kind}: max abs weight difference from one process {max(both(job, f'xla_{kind}_max_abs_diff')):.1e}")
    assert both(job, f"xla_{kind}_kept") == [True, True]
    assert min(both(job, f"xla_{kind}_traced")) >= 1
    assert max(both(job, f"xla_{kind}_max_abs_diff")) <= TOL
    a, b = both(job, f"xla_{kind}_digest")
    assert a == b
    assert both(job, f"xla_{kind}_calls_per_step") == [2.0, 2.0]


def test_xla_kept_with_backward_passes_per_step(job):
    assert both(job, "xla_bpps2_kept") == [True, True]
    assert both(job, "xla_bpps2_iterations") == [10, 10]
    assert max(both(job, "xla_bpps2_max_abs_diff")) <= TOL


def test_jit_compile_auto_is_keras_choice(job):
    # Keras's "auto" leaves XLA off on a machine without a GPU; training is the uncompiled one.
    assert both(job, "xla_auto_jit_after") == [False, False]
    assert max(both(job, "xla_auto_max_abs_diff")) <= TOL


@pytest.mark.parametrize("prefix", ["mp", "xla_mp"])
def test_mixed_precision_overflow_on_one_rank_skips_everywhere(job, prefix):
    """Also with XLA kept (xla_mp): the loss scaled inside the compiled function, the check outside."""
    for r in (0, 1):
        res = job.results[r]
        assert res[f"{prefix}_kept"] is (prefix == "xla_mp")
        assert res[f"{prefix}_is_loss_scale"] and res[f"{prefix}_is_distributed"]
        assert res[f"{prefix}_finite"]
        # One of 10 steps overflowed on rank 1 only: both ranks skipped it and halved the scale.
        assert res[f"{prefix}_iterations"] == 9
        assert res[f"{prefix}_scale"] == 2.0 ** 14


def test_resume_from_plain_checkpoint_with_load_model_is_exact(scenarios):
    job = scenarios["resume"]
    for r in (0, 1):
        assert job.results[r]["optimizer_type"] == "DistributedOptimizer"
        assert job.results[r]["iterations"] == [32, 32]  # 64 rows each, batch 8, 4 epochs
        assert job.results[r]["resumed_vs_whole"] <= 1e-6
        print(f"rank {r}: resumed vs uninterrupted max abs diff {job.results[r]['resumed_vs_whole']:.1e}")
