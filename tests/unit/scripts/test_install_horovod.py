"""scripts/install_horovod.sh decides Horovod's GPU operations from the venv it installs into.

Run as `make install` runs it, on recorded venv layouts with a stand-in TensorFlow, with
HVDKERAS_HOROVOD_PLAN_ONLY=1: it prints the build's GPU variables and stops before building. A script that
looked for NCCL only in `ldconfig -p` (its check before scripts/gpu_build.py) builds a CUDA TensorFlow's
Horovod without NCCL here, since NCCL from TensorFlow's wheel is never in ldconfig: the first test fails.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from . import SCRIPTS, layout

CUDA_TF = '''__version__ = "2.21.0"
class test:
    is_built_with_cuda = staticmethod(lambda: {cuda})
class sysconfig:
    get_build_info = staticmethod(lambda: {{"cuda_version": "12.5.1", "is_cuda_build": {cuda},
        "cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]}})
'''


def venv(root: Path, cuda: bool, nccl_wheel: bool) -> Path:
    """A venv whose TensorFlow is (or is not) a CUDA build, with or without the nvidia-nccl-cu12 wheel."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    site = next(root.glob("lib/python3*/site-packages"))
    (site / "tensorflow").mkdir()
    (site / "tensorflow" / "__init__.py").write_text(CUDA_TF.format(cuda=cuda))
    if nccl_wheel:
        layout(site, ["nvidia/nccl/include/nccl.h", "nvidia/nccl/lib/libnccl.so.2"])
    return root / "bin" / "python"


@pytest.fixture
def cuda_home(tmp_path):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    return nvcc.parent.parent


def plan(python: Path, **env) -> subprocess.CompletedProcess:
    # No /usr/local/bin on PATH: this machine's image has a CUDA 13 nvcc there.
    return subprocess.run(["bash", str(SCRIPTS / "install_horovod.sh"), str(python)], capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HVDKERAS_HOROVOD_PLAN_ONLY": "1",
                                                       "HOME": str(python.parent.parent), **env})


def test_a_cuda_tensorflow_gets_nccl_from_its_wheel(tmp_path, cuda_home):
    done = plan(venv(tmp_path / "venv", cuda=True, nccl_wheel=True), CUDA_HOME=str(cuda_home))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in lines and "HOROVOD_NCCL_LINK=SHARED" in lines
    assert f"HOROVOD_CUDA_HOME={cuda_home}" in lines and "HOROVOD_BUILD_CUDA_CC_LIST=60,70,80,89,90" in lines
    assert "GPU_TAG=nccl2.32.3" in lines and "HVDKERAS_HOROVOD_RPATH=$ORIGIN/../../nvidia/nccl/lib" in lines
    assert any(line.startswith("HOROVOD_NCCL_HOME=") for line in lines)
    assert ("PATCHES=no-xla-mpi-ops,gloo-process-set-iface,gloo-recv-before-send,gloo-controller-ranks,torch-not-built,"
            "tf-gpu-stream,"
            "nccl-rpath") in lines


def test_a_cuda_tensorflow_without_nccl_or_nvcc_stops_the_install(tmp_path, cuda_home):
    done = plan(venv(tmp_path / "venv", cuda=True, nccl_wheel=False), CUDA_HOME=str(cuda_home))
    assert done.returncode == 1 and "GPU_TAG" not in done.stdout
    assert "- NCCL: no HOROVOD_NCCL_HOME" in done.stderr and "install_horovod.sh: error" in done.stderr
    done = plan(venv(tmp_path / "venv2", cuda=True, nccl_wheel=True), CUDA_HOME=str(tmp_path / "no-toolkit"))
    assert done.returncode == 1 and "CUDA_HOME must be a CUDA toolkit with bin/nvcc" in done.stderr


def test_a_cpu_tensorflow_builds_for_cpu(tmp_path):
    done = plan(venv(tmp_path / "venv", cuda=False, nccl_wheel=True))
    assert done.returncode == 0, done.stderr
    assert "GPU_TAG=cpu" in done.stdout.splitlines() and "HOROVOD_GPU_OPERATIONS" not in done.stdout
    assert "tf-gpu-stream" not in done.stdout  # CPU builds, and their cached wheels, keep their patches
