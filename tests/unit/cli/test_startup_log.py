"""hvdkeras.cli.startup_log: TensorFlow's C++ start-up lines, as TensorFlow 2.21 prints them (recorded
2026-12-05), are left out of a job's output, bare or with horovodrun's prefix; everything else passes, and
HVDKERAS_TF_STARTUP_LOG=1 keeps them. `hvdkeras run` (`stream`, `supervise`) and `make demo` use it."""

import io
import os
import subprocess
import sys

import pytest

from hvdkeras.cli.startup_log import copy, startup_line
from hvdkeras.cli.supervise import stream, supervise

STARTUP = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    b"I0000 00:00:1796515140.758357    3847 port.cc:153] oneDNN custom operations are on. You may see slightly "
    b"different numerical results due to floating-point round-off errors from different computation orders. To "
    b"turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n",
    b"I0000 00:00:1796515140.788491    3847 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    b"available CPU instructions in performance-critical operations.\n",
    b"To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the "
    b"appropriate compiler flags.\n",
]
KEPT = [
    b"Epoch 1/12\n",
    b"45/45 - 2s - 40ms/step - accuracy: 0.6525 - loss: 1.1590 - val_accuracy: 0.9056\n",
    # TensorFlow's warnings and errors, even from the same sources, and other informational lines.
    b"W0000 00:00:1796515140.758357    3847 port.cc:153] something went wrong\n",
    b"E0000 00:00:1796515140.788491    3847 cpu_feature_guard.cc:227] an error\n",
    b"I0000 00:00:1796515140.788491    3847 gloo_context.cc:12] Gloo is up\n",
    b"WARNING: something else\n",
    b"Traceback (most recent call last):\n",
]


def test_the_startup_lines_are_recognised_bare_and_rank_prefixed():
    for line in STARTUP:
        assert startup_line(line) and startup_line(line.rstrip(b"\n")), line
        assert startup_line(b"[0]<stderr>:" + line) and startup_line(b"[13]<stdout>:" + line), line
    for line in KEPT:
        assert not startup_line(line) and not startup_line(b"[1]<stderr>:" + line), line
    # A start-up line quoted inside another line is the other line's.
    assert not startup_line(b"log: " + STARTUP[0])


def test_copy_leaves_out_the_startup_lines_unless_asked_to_keep_them():
    text = b"".join(STARTUP[:2] + KEPT[:1] + STARTUP[2:] + KEPT[1:])
    out = io.BytesIO()
    copy(io.BytesIO(text), out)
    assert out.getvalue() == b"".join(KEPT)
    out = io.BytesIO()
    copy(io.BytesIO(text), out, keep_startup=True)
    assert out.getvalue() == text


@pytest.mark.parametrize("value, kept", [(None, False), ("0", False), ("1", True), ("yes", True),
                                         ("maybe", True)])
def test_the_module_filters_its_input_as_the_variable_says(value, kept):
    env = {k: v for k, v in os.environ.items() if k != "HVDKERAS_TF_STARTUP_LOG"}
    if value is not None:
        env["HVDKERAS_TF_STARTUP_LOG"] = value
    text = b"".join(STARTUP + KEPT)
    done = subprocess.run([sys.executable, "-m", "hvdkeras.cli.startup_log"], input=text, capture_output=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (text if kept else b"".join(KEPT))
    if value == "maybe":  # a bad value loses no output, and says what it expects
        assert b"HVDKERAS_TF_STARTUP_LOG must be one of 1/0/true/false" in done.stderr
    else:
        assert done.stderr == b""  # not even runpy's warning about a module imported before it runs


def _printer() -> list[str]:
    code = ("import sys\n"
            f"sys.stderr.buffer.write({b''.join(STARTUP)!r}); sys.stderr.flush()\n"
            "print('Epoch 1/1', flush=True)\n")
    return [sys.executable, "-c", code]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("startup_log", [False, True])
def test_hvdkeras_run_passes_the_startup_lines_only_when_asked(capfd, startup_log):
    assert stream(_printer(), dict(os.environ), startup_log=startup_log) == 0
    out, _ = capfd.readouterr()
    assert "Epoch 1/1" in out and ("oneDNN custom operations" in out) == startup_log
    assert ("absl::InitializeLog" in out) == startup_log and ("To enable the following" in out) == startup_log
    assert supervise([(_printer(), {"RANK": str(r)}) for r in range(2)], startup_log=startup_log) == 0
    out, _ = capfd.readouterr()
    assert "[0]<stdout>:Epoch 1/1" in out and "[1]<stdout>:Epoch 1/1" in out
    assert ("[1]<stderr>:I0000" in out) == startup_log and ("absl::InitializeLog" in out) == startup_log
