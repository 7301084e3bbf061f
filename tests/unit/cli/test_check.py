"""hvdkeras.cli.check (`hvdkeras check`): what it prints and its verdict, with the 2-process run replaced (the real
one: tests/multiworker/test_launchers_2w.py)."""

import subprocess

import pytest

from hvdkeras.cli import check as check_module


def run_check(monkeypatch, result=None, raises=None, horovodrun="/venv/bin/horovodrun"):
    commands = []

    def fake_run(cmd, **kwargs):  # noqa: ARG001
        commands.append(cmd)
        if raises is not None:
            raise raises
        return result

    monkeypatch.setattr(check_module, "find_horovodrun", lambda which, python: horovodrun)
    monkeypatch.setattr(check_module.subprocess, "run", fake_run)
    lines = []
    code = check_module.check(timeout=7, out=lines.append)
    return code, lines, commands


def test_pass_after_the_versions_the_build_and_the_gpus(monkeypatch):
    done = subprocess.CompletedProcess([], 0, stdout="allreduce ok [0.3, -0.05, 0.4]\n", stderr="")
    code, lines, commands = run_check(monkeypatch, result=done)
    assert code == 0
    assert lines[0].startswith("TensorFlow ") and "Keras " in lines[0] and "Horovod " in lines[0]
    assert lines[1].startswith("Horovod controllers: Gloo [X]")
    assert "NCCL [" in lines[2] and lines[3].startswith("GPUs visible: ")
    assert lines[-1].startswith("PASS: 2-process Gloo allreduce")
    assert commands[0][:6] == ["/venv/bin/horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"]


@pytest.mark.parametrize("result, raises, horovodrun, verdict", [
    (subprocess.CompletedProcess([], 1, stdout="", stderr="boom\nlast words"), None, "/h",
     "FAIL: 2-process allreduce exited with 1: boom | last words"),
    (subprocess.CompletedProcess([], 0, stdout="nothing", stderr=""), None, "/h",
     "FAIL: 2-process allreduce exited with 0"),
    (None, subprocess.TimeoutExpired("horovodrun", 7), "/h", "FAIL: the 2-process allreduce did not finish within 7 s"),
    (None, OSError("no such file"), "/h", "FAIL: OSError: no such file"),
    (None, None, None, "FAIL: horovodrun not found"),
])
def test_each_failure_is_one_fail_line_and_exit_1(monkeypatch, result, raises, horovodrun, verdict):
    code, lines, _ = run_check(monkeypatch, result=result, raises=raises, horovodrun=horovodrun)
    assert code == 1
    assert lines[-1].startswith(verdict), lines[-1]
