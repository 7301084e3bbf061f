"""scripts/gpu_build.py: where Horovod's GPU build finds NCCL and nvcc, over recorded install layouts.

The layouts are those of the wheels `tensorflow[and-cuda]==2.21.0` installs (recorded 2026-12-02 from
nvidia-nccl-cu12 2.32.3, nvidia-cuda-nvcc-cu12 12.9.86 and nvidia-cuda-runtime-cu12 12.9.79): the nvcc
wheel holds bin/ptxas and nvvm, no bin/nvcc.
"""

import subprocess
import sys

import pytest

from . import SCRIPTS, layout, load

gpu_build = load("gpu_build")
SCRIPT = SCRIPTS / "gpu_build.py"

WHEEL_FILES = [
    "nvidia/nccl/include/nccl.h", "nvidia/nccl/lib/libnccl.so.2",
    "nvidia/cuda_nvcc/bin/ptxas", "nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so",
    "nvidia/cuda_runtime/include/cuda_runtime.h", "nvidia/cuda_runtime/lib/libcudart.so.12",
]
LDCONFIG_WITH_NCCL = "\tlibnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2\n"


@pytest.fixture
def wheels(tmp_path):
    """A venv's site-packages with TensorFlow's CUDA wheels."""
    return layout(tmp_path / "site-packages", WHEEL_FILES)


def plan(site, tmp_path, environ=None, ldconfig="", which=lambda name: None, system=(), tf_cuda=True):
    # The system's files are faked: this machine's own /usr/local/cuda must not count.
    exists = lambda p: (str(p).startswith(str(tmp_path)) and p.is_file()) or str(p) in system  # noqa: E731
    return gpu_build.plan(tf_cuda, environ or {}, [site], ldconfig, tmp_path / "work", which=which, exists=exists)


def test_cuda_wheels_alone_fail_naming_nvcc_and_how_to_get_it(wheels, tmp_path):
    with pytest.raises(gpu_build.GpuBuildError) as err:
        plan(wheels, tmp_path)
    message = str(err.value)
    assert "TensorFlow is a CUDA build" in message and "nvcc" in message and "holds ptxas but not nvcc" in message
    assert "set CUDA_HOME" in message and "- NCCL" not in message  # NCCL was found in its wheel
    assert "scripts/cuda_toolkit.py" in message  # the way to make one here


def test_nccl_from_its_wheel_with_a_system_toolkit(wheels, tmp_path):
    """What an ldconfig-only check missed: NCCL from a wheel is never in ldconfig."""
    toolkit = layout(tmp_path / "cuda-12.4", ["bin/nvcc"])
    build = plan(wheels, tmp_path, environ={"CUDA_HOME": str(toolkit)})
    env = dict(build.env)
    assert build.operations == "NCCL" and env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert env["HOROVOD_NCCL_HOME"] == str(tmp_path / "work" / "nccl") and env["HOROVOD_NCCL_LINK"] == "SHARED"
    assert env["HOROVOD_CUDA_HOME"] == str(toolkit)
    links = dict(build.links)
    assert links[str(tmp_path / "work" / "nccl" / "lib" / "libnccl.so")] == str(wheels / "nvidia/nccl/lib/libnccl.so.2")
    assert links[str(tmp_path / "work" / "nccl" / "include")] == str(wheels / "nvidia/nccl/include")
    assert build.tag == "nccl2.32.3"
    # The wheel's NCCL is in no system path: Horovod's library finds it beside itself in site-packages.
    assert build.rpath == "$ORIGIN/../../nvidia/nccl/lib"
    assert "HOROVOD_BUILD_CUDA_CC_LIST" not in env  # TensorFlow's GPUs not given: Horovod's own default


def test_kernels_are_built_for_tensorflows_gpus_unless_set(wheels, tmp_path):
    toolkit = layout(tmp_path / "cuda-12.4", ["bin/nvcc"])
    tf_21 = ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]  # tf.sysconfig.get_build_info() of 2.21.0
    build = gpu_build.plan(True, {"CUDA_HOME": str(toolkit)}, [wheels], "", tmp_path / "work",
                           which=lambda name: None, tf_compute_capabilities=tf_21)
    assert dict(build.env)["HOROVOD_BUILD_CUDA_CC_LIST"] == "60,70,80,89,90"
    build = gpu_build.plan(True, {"CUDA_HOME": str(toolkit), "HOROVOD_BUILD_CUDA_CC_LIST": "80"}, [wheels], "",
                           tmp_path / "work", which=lambda name: None, tf_compute_capabilities=tf_21)
    assert "HOROVOD_BUILD_CUDA_CC_LIST" not in dict(build.env)  # the user's own list is left to Horovod


def test_system_cuda_and_nccl_take_precedence_over_the_wheels(wheels, tmp_path):
    build = plan(wheels, tmp_path, ldconfig=LDCONFIG_WITH_NCCL, system={"/usr/local/cuda/bin/nvcc"})
    env = dict(build.env)
    assert env == {"HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_CUDA_HOME": "/usr/local/cuda"}
    assert build.links == () and build.tag == "ncclsystem" and build.rpath == ""
    nccl_home = layout(tmp_path / "nccl", ["include/nccl.h", "lib/libnccl.so"])
    build = plan(wheels, tmp_path, environ={"HOROVOD_NCCL_HOME": str(nccl_home)}, ldconfig=LDCONFIG_WITH_NCCL,
                 which=lambda name: "/opt/cuda/bin/nvcc")
    assert dict(build.env)["HOROVOD_NCCL_HOME"] == str(nccl_home) and build.tag == "nccl2.32.3"
    assert dict(build.env)["HOROVOD_CUDA_HOME"] == "/opt/cuda"


def test_a_toolkit_of_another_cuda_major_than_tensorflows_is_refused(wheels, tmp_path):
    """This machine's image has a CUDA 13.0 toolkit in /usr/local/cuda; TensorFlow 2.21's wheels are CUDA 12."""
    with pytest.raises(gpu_build.GpuBuildError, match=r"is CUDA 13.0, but TensorFlow was built with CUDA 12.5.1"):
        gpu_build.plan(True, {}, [wheels], "", tmp_path / "work", which=lambda name: None,
                       exists=lambda p: str(p) == "/usr/local/cuda/bin/nvcc", tf_cuda_version="12.5.1",
                       release=lambda home: "13.0")
    build = gpu_build.plan(True, {}, [wheels], "", tmp_path / "work", which=lambda name: None,
                           exists=lambda p: str(p) == "/usr/local/cuda/bin/nvcc", tf_cuda_version="12.5.1",
                           release=lambda home: "12.4")
    assert build.operations == "NCCL"


def test_a_wheel_that_holds_nvcc_makes_a_cuda_home(tmp_path):
    site = layout(tmp_path / "site-packages", WHEEL_FILES + ["nvidia/cuda_nvcc/bin/nvcc"])
    build = plan(site, tmp_path)
    cuda_home = tmp_path / "work" / "cuda"
    assert dict(build.env)["HOROVOD_CUDA_HOME"] == str(cuda_home)
    assert dict(build.links)[str(cuda_home / "bin")] == str(site / "nvidia/cuda_nvcc/bin")


def test_no_cuda_builds_for_cpu(wheels, tmp_path):
    build = plan(tmp_path / "empty", tmp_path, tf_cuda=False)
    assert build.operations == "" and build.env == () and build.tag == "cpu"


def test_cuda_without_nccl_fails_naming_nccl(tmp_path):
    site = layout(tmp_path / "site-packages", [f for f in WHEEL_FILES if "/nccl/" not in f])
    with pytest.raises(gpu_build.GpuBuildError, match=r"- NCCL: no HOROVOD_NCCL_HOME.*pip install nvidia-nccl-cu12"):
        plan(site, tmp_path, system={"/usr/local/cuda/bin/nvcc"})


def test_forcing_and_bad_settings(wheels, tmp_path):
    assert plan(wheels, tmp_path, environ={"HOROVOD_GPU_OPERATIONS": ""}).tag == "cpu"
    with pytest.raises(gpu_build.GpuBuildError, match="Received: HOROVOD_GPU_OPERATIONS='MPI'"):
        plan(wheels, tmp_path, environ={"HOROVOD_GPU_OPERATIONS": "MPI"})
    with pytest.raises(gpu_build.GpuBuildError, match="HOROVOD_GPU_OPERATIONS=NCCL"):
        plan(tmp_path / "empty", tmp_path, environ={"HOROVOD_GPU_OPERATIONS": "NCCL"}, tf_cuda=False)
    with pytest.raises(gpu_build.GpuBuildError, match="Received: CUDA_HOME="):
        plan(wheels, tmp_path, environ={"CUDA_HOME": str(tmp_path / "nothing")})
    with pytest.raises(gpu_build.GpuBuildError, match="Received: HOROVOD_NCCL_HOME="):
        plan(wheels, tmp_path, environ={"HOROVOD_NCCL_HOME": str(tmp_path / "nothing")})


def test_the_command_prints_the_builds_variables_or_fails(tmp_path):
    """Run as install_horovod.sh runs it, with this venv's (CPU) TensorFlow."""
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "GPU_TAG=cpu" in done.stdout
    forced = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "HOROVOD_GPU_OPERATIONS": "NCCL"})
    assert forced.returncode == 1 and "gpu_build.py: error: HOROVOD_GPU_OPERATIONS=NCCL" in forced.stderr


def _nvcc(home, text: str):
    nvcc = home / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(f"#!/bin/sh\nprintf '%s\\n' {text!r}\n")
    nvcc.chmod(0o755)
    return home


def test_one_parser_reads_nvccs_release_and_version_for_both_scripts(tmp_path):
    cuda_toolkit = load("cuda_toolkit")
    printed = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.4, V12.4.131"
    home = _nvcc(tmp_path / "ok", printed)
    assert gpu_build.nvcc_version(str(home)) == ("12.4", "12.4.131")
    assert gpu_build.nvcc_release(str(home)) == "12.4"
    assert cuda_toolkit.nvcc_release(home) == "12.4.131"
    assert cuda_toolkit.gpu_build.nvcc_version is not None  # the same parser, not a copy
    other = _nvcc(tmp_path / "other", "Cuda compilation tools, release 13.0, V13.0.48")
    assert gpu_build.nvcc_release(str(other)) == "13.0"
    with pytest.raises(cuda_toolkit.ToolkitError, match="must say V12.4.131. Received: V13.0.48"):
        cuda_toolkit.nvcc_release(other)
    silent = _nvcc(tmp_path / "silent", "no version here")
    assert gpu_build.nvcc_version(str(silent)) is None
    with pytest.raises(cuda_toolkit.ToolkitError, match="Received: no version"):
        cuda_toolkit.nvcc_release(silent)
    assert gpu_build.nvcc_version(str(tmp_path / "missing")) is None
