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
