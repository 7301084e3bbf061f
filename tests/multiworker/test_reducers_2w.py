"""The reducers on 2 real Gloo workers, each on its own rows: post-local SGD (hvdkeras.reduce.LocalSGDReducer)
equals the exact allreduce with period 1 and plain SGD, keeps the ranks apart between averagings and identical
right after each, is exact during its warm-up, and saves its count of updates with the optimizer. DiLoCo
(hvdkeras.reduce.DiLoCoReducer) with period 1, outer rate 1 and no momentum equals the exact allreduce too, and
with its outer Nesterov SGD brings ranks that started apart to identical weights at each synchronisation."""

SCENARIOS = ("reducers",)
TOL = 1e-5


def both(job, key):
    return [job.results[r][key] for r in (0, 1)]


def identical(job, key):
    """Per update, whether the two ranks' weights were identical after it."""
    a, b = both(job, key)
    return [x == y for x, y in zip(a, b)]


def test_local_sgd_with_period_1_is_the_exact_allreduce(job):
    for traced in (True, False):
        diffs = both(job, f"period1_traced{traced}_max_abs_diff")
        print(f"local SGD, period 1 (traced {traced}): max abs difference from the allreduce {max(diffs):.1e}")
        assert max(diffs) <= TOL
        assert all(identical(job, f"period1_traced{traced}_digests"))


def test_local_sgd_ranks_differ_between_averagings_and_agree_after_each(job):
    assert identical(job, "period3_digests") == [False, False, True, False, False, True]
    assert both(job, "period3_updates") == [6, 6]


def test_local_sgd_is_exact_during_its_warmup(job):
    assert identical(job, "warmup_digests") == [True, True, False, True, False, True]


def test_local_sgd_saves_its_count_of_updates_with_the_optimizer(job):
    assert both(job, "saved_updates") == [6, 6] and both(job, "loaded_updates") == [6, 6]
    a, b = both(job, "fit_digest")
    assert a == b


def test_diloco_with_period_1_outer_rate_1_and_no_momentum_is_the_exact_allreduce(job):
    diffs = both(job, "diloco1_max_abs_diff")
    print(f"DiLoCo, period 1, outer rate 1, momentum 0: max abs difference from the allreduce {max(diffs):.1e}")
    assert max(diffs) <= TOL and all(identical(job, "diloco1_digests"))


def test_diloco_synchronises_ranks_that_started_apart_every_period(job):
    assert identical(job, "diloco3_digests") == [False, False, True, False, False, True]
    a, b = both(job, "diloco3_anchor_digest")
    assert a == b  # the anchor: the workers' average at the first update, then the outer steps, alike
    assert both(job, "diloco3_state") == [1 + 2 * 4, 1 + 2 * 4]  # the count, then an anchor and a momentum per variable


def test_powersgd_with_a_rank_at_least_the_smaller_side_is_the_exact_allreduce(job):
    diffs = both(job, "powersgd_full_max_abs_diff")
    print(f"PowerSGD, rank >= each kernel's smaller side: max abs difference from the allreduce {max(diffs):.1e}")
    assert max(diffs) <= TOL and all(identical(job, "powersgd_full_digests"))


def test_powersgd_is_exact_before_its_start_step_and_keeps_the_ranks_identical(job):
    exact, low = both(job, "exact_digests")[0], both(job, "powersgd_rank1_digests")[0]
    assert low[:2] == exact[:2] and low[2] != exact[2]
    assert all(identical(job, "powersgd_rank1_digests"))


def test_powersgd_on_a_distributed_gradient_tape(job):
    diffs = both(job, "tape_full_max_abs_diff")
    print(f"PowerSGD on a tape, full rank: max abs difference from the allreduce {max(diffs):.1e}")
    assert max(diffs) <= TOL and all(identical(job, "tape_full_digests"))
    assert all(identical(job, "tape_rank1_digests"))
    assert both(job, "tape_rank1_digests")[0] != both(job, "tape_full_digests")[0]


def test_fp16_composes_with_powersgd(job):
    assert all(identical(job, "powersgd_fp16_digests"))
    a, _ = both(job, "powersgd_fp16_digests")
    b, _ = both(job, "powersgd_rank1_digests")
    assert a != b  # sent as float16: not the float32 run's bits
    diffs = both(job, "powersgd_fp16_max_abs_diff")
    print(f"PowerSGD rank 1 with fp16 against float32: max abs difference {max(diffs):.1e}")
    assert max(diffs) <= 1e-2


def test_each_reducer_resumes_from_a_checkpoint_or_a_backup_bit_for_bit(job):
    for label in ("powersgd", "local_sgd", "diloco"):
        for rank in (0, 1):
            result = job.results[rank]
            assert result[f"resume_{label}_whole"] == result[f"resume_{label}_resumed"], (label, rank)
            assert result[f"resume_{label}_whole"] == result[f"backup_{label}_resumed"], (label, rank, "backup")
    # PowerSGD's error feedback, and the momentum of local SGD's and DiLoCo's inner optimizer, are each worker's
    # own: the checkpoint held both workers', and each rank took its own.
    for label in ("powersgd", "local_sgd", "diloco"):
        a, b = both(job, f"resume_{label}_own_state")
        assert a != b, label


def test_batch_norm_statistics_are_averaged_at_each_synchronisation(job):
    for label in ("local_sgd", "diloco"):
        a, b = both(job, f"bn_{label}_stats")
        assert a == b, label
        a, b = both(job, f"bn_{label}_weights")
        assert a == b, label  # 6 updates, period 3: synchronised at the end
        a, b = both(job, f"bn_{label}_loop_stats")
        assert a != b, f"{label}: a loop that passes no model state keeps each worker's statistics"
