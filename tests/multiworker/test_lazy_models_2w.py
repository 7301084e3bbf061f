"""Models that Keras builds lazily (no Input layer, subclassed) on 2 real Gloo workers."""

import pytest

SCENARIOS = ("lazy",)  # run in the one scenarios launch (conftest.py), as `job`


@pytest.mark.parametrize("kind", ["sequential", "subclassed"])
def test_differently_seeded_lazy_models_train_like_one_process_from_rank0(job, kind):
    for r in (0, 1):
        assert job.results[r][f"{kind}_max_abs_diff"] <= 1e-5
        assert job.results[r][f"{kind}_iterations"] == 6
    assert job.results[0][f"{kind}_digest"] == job.results[1][f"{kind}_digest"]
    assert job.results[0][f"{kind}_second_digest"] == job.results[1][f"{kind}_second_digest"]
    print(f"{kind}: max abs diff to one process {max(job.results[r][f'{kind}_max_abs_diff'] for r in (0, 1)):.1e}")


def test_horovod_keras_mnist_example_style(job):
    assert job.results[0]["mnist_digest"] == job.results[1]["mnist_digest"]
    assert job.results[0]["mnist_accuracy"] == job.results[1]["mnist_accuracy"]  # global metrics on both
    assert sorted(p.name for p in job.out.glob("checkpoint-*.keras")) == ["checkpoint-1.keras", "checkpoint-2.keras"]


def test_lazy_model_under_python_m_hvdkeras(tmp_path):
    import json

    from launch import VENV_BIN, WORKERS, run_command

    cmd = [str(VENV_BIN / "hvdkeras"), "run", "-np", "2", "--report-dir", str(tmp_path / "report"),
           str(WORKERS / "plain_lazy_script.py")]
    job = run_command(cmd, tmp_path, timeout=300)
    if job.returncode != 0:
        job.fail(f"hvdkeras run exited {job.returncode}")
    reports = [json.loads((tmp_path / "report" / f"rank{r}.json").read_text()) for r in (0, 1)]
    # The global batch: 640 rows in batches of 32, 16 rows each, 2 epochs. Each process seeds itself by rank, so
    # the workers shuffle alike only with the seed hvdkeras shares.
    assert [r["fit_steps"] for r in reports] == [[40], [40]]
    assert reports[0]["weights_sha256"] == reports[1]["weights_sha256"]
