"""The package's layers (setup.cfg's import-linter contracts): kept by the tree, broken by an upward import."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINT = pathlib.Path(sys.executable).with_name("lint-imports")


def lint(root: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120)


def copy_of_the_package(tmp_path: pathlib.Path) -> pathlib.Path:
    for name in ("hvdkeras", "callbacks"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")
    return tmp_path


def test_the_tree_keeps_every_contract():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


LAYERS = "over training over the reducers over the job, comm and basics"


@pytest.mark.parametrize("module, upward, contract", [
    # entry > wrap > callbacks > training > reduce > job, comm and basics, each breached from below
    ("hvdkeras/wrap/methods.py", "from hvdkeras.cli import command", LAYERS),
    ("callbacks/broadcast.py", "from hvdkeras import wrap", LAYERS),
    ("hvdkeras/training/loops.py", "import callbacks", LAYERS),
    ("hvdkeras/training/optimizer.py", "from hvdkeras.wrap import state", LAYERS),
    ("hvdkeras/reduce/groups.py", "from hvdkeras import wrap", LAYERS),
    ("hvdkeras/reduce/base.py", "from hvdkeras.training import optimizer", LAYERS),
    ("hvdkeras/reduce/allreduce.py", "from hvdkeras.training import tape", LAYERS),
    ("hvdkeras/basics.py", "from hvdkeras.training import loops", LAYERS),
    ("hvdkeras/collectives.py", "from hvdkeras.reduce import base", LAYERS),
    ("hvdkeras/job/lifecycle.py", "from hvdkeras.training import sync_batch_norm", LAYERS),
    ("hvdkeras/settings.py", "from hvdkeras.job import threads", LAYERS),
    ("hvdkeras/reduce/allreduce.py", "from hvdkeras.job import lifecycle", "know nothing of launching"),
    ("hvdkeras/training/optimizer.py", "from hvdkeras.job import launchers", "know nothing of launching"),
    ("hvdkeras/cli/command.py", "import tensorflow", "start without TensorFlow"),
    ("callbacks/metrics.py", "import horovod.tensorflow", "Only the seam imports Horovod"),
])
def test_an_upward_import_breaks_a_contract(tmp_path, module, upward, contract):
    root = copy_of_the_package(tmp_path)
    with open(root / module, "a") as f:
        f.write(f"\n{upward}  # noqa\n")
    out = lint(root)
    assert out.returncode != 0, out.stdout
    broken = out.stdout.split("Broken contracts", 1)[-1]
    assert contract in " ".join(broken.split()), out.stdout
