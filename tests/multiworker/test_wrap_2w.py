"""Zero code changes: an unmodified Keras script run with `hvdkeras run -np 2`, and `hvdkeras check`."""

import json
import sys
from pathlib import Path

import pytest

from launch import REPO, VENV_BIN, run_command

SCRIPT = REPO / "examples" / "plain_keras_digits.py"
EPOCHS = 2


def _run_two(out, *options):
    cmd = [str(VENV_BIN / "hvdkeras"), "run", "-np", "2", *options, "--report-dir", str(out / "report"), str(SCRIPT),
           "--epochs", str(EPOCHS), "--out-dir", str(out / "model")]
    job = run_command(cmd, out, timeout=300)
    if job.returncode != 0:
        job.fail(f"hvdkeras run exited with {job.returncode}")
    job.out = out
    job.reports = {r: json.loads((out / "report" / f"rank{r}.json").read_text()) for r in (0, 1)}
    return job


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """The default, Keras's batch convention (--batch global)."""
    return _run_two(tmp_path_factory.mktemp("wrap2"))


@pytest.fixture(scope="module")
def per_worker(tmp_path_factory):
    return _run_two(tmp_path_factory.mktemp("wrap2pw"), "--batch", "per-worker")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return _run_two(tmp_path_factory.mktemp("wrap2sharded"), "--shard-optimizer-state")


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    out = tmp_path_factory.mktemp("wrap1")
    cmd = [sys.executable, "-m", "hvdkeras", "--report-dir", str(out / "report"), str(SCRIPT),
           "--epochs", str(EPOCHS), "--out-dir", str(out / "model")]
    job = run_command(cmd, out, timeout=300)
    if job.returncode != 0:
        job.fail(f"python -m hvdkeras exited with {job.returncode}")
    return json.loads((out / "report" / "rank0.json").read_text())


def test_global_batch_each_worker_runs_one_process_steps_on_half_of_each_batch(two, one):
    assert [two.reports[r]["fit_steps"] for r in (0, 1)] == [one["fit_steps"]] * 2


def test_per_worker_batch_each_worker_runs_half_the_steps(per_worker, one):
    single = one["fit_steps"][0]
    for r in (0, 1):
        assert abs(per_worker.reports[r]["fit_steps"][0] - single / 2) <= 1
    assert per_worker.reports[0]["weights_sha256"] == per_worker.reports[1]["weights_sha256"]


def test_weights_identical_on_both_ranks(two):
    assert two.reports[0]["weights_sha256"] == two.reports[1]["weights_sha256"]


def test_shard_optimizer_state_trains_the_same_weights_and_saves_the_full_state(sharded, two):
    import keras
    import numpy as np

    assert [sharded.reports[r]["sharded_optimizers"] for r in (0, 1)] == [["optimizer"]] * 2
    assert two.reports[0]["sharded_optimizers"] == []
    assert sharded.reports[0]["weights_sha256"] == sharded.reports[1]["weights_sha256"]
    assert sharded.reports[0]["weights_sha256"] == two.reports[0]["weights_sha256"]
    names = sorted(p.name for p in (sharded.out / "model").iterdir())
    assert names == [f"ckpt-{e:02d}.keras" for e in range(1, EPOCHS + 1)] + ["digits.keras"]
    for name in ("ckpt-01.keras", "digits.keras"):  # ModelCheckpoint's and the script's model.save
        ours, theirs = (keras.models.load_model(job.out / "model" / name).optimizer for job in (sharded, two))
        assert len(ours.variables) == len(theirs.variables)
        for a, b in zip(ours.variables, theirs.variables):
            np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))


def test_one_checkpoint_per_epoch_and_one_saved_model(two):
    names = sorted(p.name for p in (two.out / "model").iterdir())
    assert names == [f"ckpt-{e:02d}.keras" for e in range(1, EPOCHS + 1)] + ["digits.keras"]


def test_progress_lines_from_rank0_only(two):
    lines = two.output.splitlines()
    assert any(line.startswith("[0]<stdout>:Epoch 1/") for line in lines)
    assert not any(line.startswith("[1]<stdout>:") and ("Epoch" in line or "/step" in line) for line in lines)


def test_saved_model_loads_with_distributed_optimizer(two):
    import hvdkeras

    model = hvdkeras.load_model(two.out / "model" / "digits.keras")
    assert isinstance(model.optimizer, hvdkeras.DistributedOptimizer)


def test_hvdkeras_check_passes(tmp_path):
    job = run_command([str(VENV_BIN / "hvdkeras"), "check"], tmp_path, timeout=240)
    assert job.returncode == 0, job.output
    lines = job.output.strip().splitlines()
    assert lines[-1].startswith("PASS")
    assert any(line.startswith("TensorFlow 2.") and "Horovod 0.28.1" in line for line in lines)
    assert any("Gloo [X]" in line for line in lines)


def test_run_with_missing_script_fails_cleanly(tmp_path):
    job = run_command([str(VENV_BIN / "hvdkeras"), "run", "-np", "2", str(tmp_path / "nope.py")], tmp_path,
                      timeout=120)
    assert job.returncode == 2 and "does not exist" in job.output
    assert list(Path(tmp_path).iterdir()) == []
