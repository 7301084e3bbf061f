"""Horovod's process sets and local variables on 2 real Gloo workers (one launch)."""



SCENARIOS = ("partial",)  # run in the one scenarios launch (conftest.py), as `job`


def test_two_process_sets_scope_collectives_and_the_optimizer(job):
    for r in (0, 1):
        res = job.results[r]
        assert res["process_set_ranks"] == [r] and res["process_set_size"] == 1
        assert res["allreduce_own_set"] == r + 1      # alone in its set
        assert res["allreduce_global"] == 1.5         # (1 + 2) / 2 over both
        assert res["allgather_own_set"] == [r]
        assert res["scoped_vs_alone"] <= 1e-6         # trained like one process on its own data
    assert job.results[0]["scoped_digest"] != job.results[1]["scoped_digest"]


def test_local_layers_stay_per_worker_and_the_rest_is_shared(job):
    for r in (0, 1):
        assert job.results[r]["head_kept_by_broadcast"] == 0.0
    assert job.results[0]["shared_after_broadcast"] == job.results[1]["shared_after_broadcast"]
    assert job.results[0]["shared_digest"] == job.results[1]["shared_digest"]
    assert job.results[0]["head_digest"] != job.results[1]["head_digest"]
