"""Faults on 2 real workers, each launch with a timeout: crashes, stalls, mismatched models, exact resume,
atomic checkpoints."""

import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from launch import VENV_BIN, WORKERS, run_command

SCRIPT = WORKERS / "faults_script.py"


def hvdkeras_run(mode, out: Path, *args, timeout=240, env=None):
    cmd = [str(VENV_BIN / "hvdkeras"), "run", "-np", "2", str(SCRIPT), mode, str(out), *args]
    job = run_command(cmd, out, timeout=timeout, env=env)
    job.ended = time.time()
    return job


def leftover_workers(out: Path) -> list:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if str(SCRIPT) in cmdline and str(out) in cmdline:
            found.append(proc.pid)
    return found


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_crash_of_one_worker_ends_the_job(tmp_path, mode):
    job = hvdkeras_run(mode, tmp_path)
    assert job.returncode != 0
    fault_time = float((tmp_path / "fault.rank1").read_text())
    exit_seconds = job.ended - fault_time
    assert exit_seconds <= 60, f"took {exit_seconds:.1f} s"
    assert "rank 1 failed first" in job.output, job.output[-3000:]
    assert not (tmp_path / "done.rank0").exists()
    time.sleep(1)
    assert leftover_workers(tmp_path) == []
    print(f"{mode}: job ended {exit_seconds:.1f} s after the fault")


def test_stalled_worker_fails_the_job_in_bounded_time(tmp_path):
    job = hvdkeras_run("stop", tmp_path, timeout=300, env={"HVDKERAS_STALL_TIMEOUT": "20"})
    assert job.returncode != 0
    exit_seconds = job.ended - float((tmp_path / "fault.rank1").read_text())
    assert exit_seconds <= 20 + 40, f"took {exit_seconds:.1f} s"
    assert "rank 1" in job.output and "stopped answering" in job.output, job.output[-3000:]
    time.sleep(1)
    assert leftover_workers(tmp_path) == []
    print(f"stop: job ended {exit_seconds:.1f} s after the fault")


@pytest.mark.parametrize("mode, variable", [("mismatch-units", "kernel"), ("mismatch-layer", "kernel")])
def test_mismatched_models_fail_fast_on_every_rank(tmp_path, mode, variable):
    start = time.time()
    job = hvdkeras_run(mode, tmp_path, timeout=120)
    assert job.returncode != 0
    assert job.ended - start <= 60
    for rank in (0, 1):
        lines = [line for line in job.output.splitlines()
                 if line.startswith(f"[{rank}]<stderr>:") and "built different models" in line]
        assert lines, job.output[-3000:]
    message = next(line for line in job.output.splitlines() if "built different models" in line)
    assert "First difference at variable #" in message and variable in message and "shape=" in message
    assert "rank 1 has" in message


def test_resume_after_killing_the_job_equals_an_uninterrupted_run(tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    for d in (whole, parts):
        d.mkdir()
    uninterrupted = hvdkeras_run("resume", whole, "--epochs", "5")
    assert uninterrupted.returncode == 0, uninterrupted.output[-3000:]
    first = hvdkeras_run("resume", parts, "--epochs", "5", "--kill-after-epoch", "2")
    assert first.returncode != 0 and (parts / "killed.rank0").exists()
    assert not (parts / "done.rank0").exists()
    second = hvdkeras_run("resume", parts, "--epochs", "5")
    assert second.returncode == 0, second.output[-3000:]
    for rank in (0, 1):
        a = np.load(whole / f"weights.rank{rank}.npz")
        b = np.load(parts / f"weights.rank{rank}.npz")
        diff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files)
        assert diff <= 1e-6
        print(f"rank {rank}: resumed vs uninterrupted max abs diff {diff:.2e}")


def test_checkpoint_killed_mid_save_leaves_no_truncated_file(tmp_path):
    job = hvdkeras_run("atomic", tmp_path, "--epochs", "3")
    assert job.returncode != 0
    import keras

    finals = sorted(p.name for p in tmp_path.glob("ckpt-*.keras"))
    assert "ckpt-01.keras" in finals
    for name in finals:
        keras.saving.load_model(tmp_path / name, compile=False)  # every file under a final name is whole
    assert "ckpt-02.keras" not in finals
    assert list(tmp_path.glob(".ckpt-02.*")), "the kill did not land during the save"
