"""Callbacks on 2 real Gloo workers (one launch, several checks)."""

import pytest

SCENARIOS = ("callbacks",)  # run in the one scenarios launch (conftest.py), as `job`


def test_first_step_starts_from_rank0_weights(job):
    for r in (0, 1):
        assert job.results[r]["broadcast_max_abs_diff"] <= 1e-5


def test_second_fit_after_rank0_only_load(job):
    for r in (0, 1):
        assert job.results[r]["second_fit_max_abs_diff"] <= 1e-5
    assert job.results[0]["second_fit_digest"] == job.results[1]["second_fit_digest"]


@pytest.mark.parametrize("name", ["accuracy", "precision", "auc", "loss"])
def test_exact_global_metrics_with_uneven_shards(job, name):
    for r in (0, 1):
        res = job.results[r]
        for value in res["history"][name]:
            assert value == pytest.approx(res["union_train"][name], abs=1e-6)
        for value in res["history"][f"val_{name}"]:
            assert value == pytest.approx(res["union_val"][name], abs=1e-6)
        assert res["evaluate_global"][name] == pytest.approx(res["union_val"][name], abs=1e-6)


def test_early_stopping_stops_all_ranks_at_the_same_epoch(job):
    assert job.results[0]["epochs_run"] == job.results[1]["epochs_run"]
    assert job.results[0]["history"] == job.results[1]["history"]


def test_warmup(job):
    for r in (0, 1):
        res = job.results[r]
        assert res["warmup_first_lr"] == pytest.approx(0.1 / 2, rel=1e-6)
        assert res["warmup_epoch_end_lrs"][1] == pytest.approx(0.1, rel=1e-6)
        assert res["warmup_epoch_end_lrs"][0] < 0.1


@pytest.mark.parametrize("folder", ["ckpts", "wrapped"])
def test_rank0_checkpoint_one_file_per_epoch(job, folder):
    import hvdkeras

    files = sorted(p.name for p in (job.out / folder).iterdir())
    assert files == ["ckpt-01.keras", "ckpt-02.keras", "ckpt-03.keras"]
    for name in files:
        model = hvdkeras.load_model(job.out / folder / name)
        assert isinstance(model.optimizer, hvdkeras.DistributedOptimizer)


def test_progress_bar_on_rank0_only(job):
    lines = job.output.splitlines()
    assert any(line.startswith("[0]<stdout>:") and "Epoch 1/3" in line for line in lines)
    # Keras's progress lines ("Epoch 1/3", "4/4 ... step"), not the harness's ("scenario custom_steps: start").
    progress = [line for line in lines if line.startswith("[1]<stdout>:") and ("Epoch" in line or "step" in line)
                and not line.startswith("[1]<stdout>:scenario ")]
    assert not progress, progress
