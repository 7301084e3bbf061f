"""shard_optimizer_state=True on 2 real Gloo workers: Gloo's reduce-scatter checked bit for bit, the same training
as the unsharded optimizer per optimizer and feature, each worker holding its part, and full checkpoints."""

import pytest

SCENARIOS = ("sharding",)  # run in the one scenarios launch (conftest.py)

KINDS = ["sgd", "adam", "adamw", "rmsprop", "adafactor", "clipnorm", "global_clipnorm", "ema", "schedule", "bpps2",
         "mixed_float16", "xla", "adamw_excluded", "embedding", "embedding_whole", "nadam"]
WHOLE = ("adafactor", "clipnorm", "embedding_whole")
# global_clipnorm's norm is summed in another order; the unsharded update of "xla" is compiled, the sharded one not.
INEXACT = ("global_clipnorm", "xla")  # the math needs whole variables: factored moments, a per-variable norm


def both(job, key):
    return [job.results[r][key] for r in (0, 1)]


def test_gloo_reducescatter_equals_allreduce_and_slice_bit_for_bit(job):
    for r in (0, 1):
        res = job.results[r]
        assert res["rs_compared"] >= 2 * 2 * 6 * 20  # alone and grouped, float32 and float16, 6 shapes, repeats
        assert res["rs_mismatches"] == []
        # Horovod's TensorFlow op has no bfloat16 (hvdkeras all-reduces bfloat16 buckets instead).
        assert "bfloat16" in res["rs_bfloat16"] and "not in the list" in res["rs_bfloat16"]
    print(f"reduce-scatter: {job.results[0]['rs_compared']} comparisons per rank, none differed")


@pytest.mark.parametrize("kind", KINDS)
def test_sharded_equals_unsharded_after_20_steps(job, kind):
    diffs = both(job, f"{kind}_max_abs_diff")
    print(f"{kind}: sharded vs unsharded max abs weight difference {max(diffs):.1e}, "
          f"state {max(both(job, f'{kind}_state_max_abs_diff')):.1e}")
    if kind in INEXACT:
        assert max(diffs) <= 1e-6
        assert max(both(job, f"{kind}_state_max_abs_diff")) <= 1e-6
    else:  # the same bits: a piece's update is the unsharded update of those rows
        assert max(diffs) == 0.0
        assert max(both(job, f"{kind}_state_max_abs_diff")) == 0.0
    assert both(job, f"{kind}_iterations") == [[20, 20], [20, 20]]
    # jit_compile=True: both kept XLA for the forward and backward pass (the unsharded update compiled too).
    assert both(job, f"{kind}_xla_kept") == [[kind == "xla"] * 2] * 2


@pytest.mark.parametrize("kind", KINDS)
def test_ranks_hold_bit_identical_weights(job, kind):
    a, b = both(job, f"{kind}_digest")
    assert a == b


@pytest.mark.parametrize("kind", KINDS)
def test_each_rank_holds_only_its_part_of_the_slots(job, kind):
    parts = both(job, f"{kind}_slot_elements")
    full = job.results[0][f"{kind}_plain_slot_elements"]
    assert sum(parts) == full  # every slot exists once in the job
    assert all(0 < p < full for p in parts)
    split = job.results[0][f"{kind}_split"]
    assert job.results[1][f"{kind}_split"] == split
    if kind in WHOLE:
        # Owned whole: one worker holds the 64x128 kernel's (or the 256x16 embedding's) slots, about 3/4 of them.
        assert split == []
        if kind != "adafactor":  # Adafactor's factored moments are not shaped like their variables
            assert max(parts) >= 2 * (64 * 128 if kind == "clipnorm" else 256 * 16)
    else:
        # Cut into runs of rows: each worker holds at most 1/N + 1% of the slots.
        assert split
        assert max(parts) <= full * (1 / 2 + 0.01)
    if kind == "adamw_excluded":
        assert "bias" not in split and "kernel" in split
    if kind == "embedding":
        assert "embeddings" in split
    gathered, unsharded = job.results[0][f"{kind}_state_count"]
    assert gathered == unsharded


def test_save_gathers_the_full_state_that_plain_keras_loads(job):
    res = job.results[0]
    for key in ("plain_load", "checkpoint_load", "rank0_only_load"):
        assert "error" not in res[key], res[key]
        assert res[key]["type"] == "Adam" and res[key]["n"] == 18 and not res[key]["hvdkeras"]
    assert res["plain_load"]["sums"] == pytest.approx(res["saved_sums"], rel=1e-12)
    assert res["checkpoint_load"]["sums"] == pytest.approx(res["checkpoint_state_sums"], rel=1e-12)
    assert res["rank0_only_load"]["sums"] == pytest.approx(res["consolidated_sums"], rel=1e-12)


def test_a_sharded_job_loads_a_full_checkpoint_and_resumes_bitwise(job):
    for r in (0, 1):
        res = job.results[r]
        assert res["restored_sharded"] and res["restored_iterations"] == 10
        assert res["resumed_bitwise"], res["resumed_max_abs_diff"]


def test_backup_and_restore_resumes_an_interrupted_sharded_run_bitwise(job):
    for r in (0, 1):
        res = job.results[r]
        assert res["backup_resumed_bitwise"]
        assert res["backup_resumed_iterations"] == 80  # 4 epochs of 20 steps
        assert res["backup_state_max_abs_diff"] == 0.0


def test_a_rank_zero_only_save_without_consolidation_says_what_to_do(job):
    assert "consolidate_state()" in job.results[0]["solo_save_error"]
