"""What Horovod's build needs for GPU operations, found from TensorFlow's install: `plan()`.

    python scripts/gpu_build.py WORK_DIR      (run by scripts/install_horovod.sh with the venv's Python)

prints shell assignments (`export NAME=value`) for Horovod's build, a `GPU_TAG=...` for the wheel cache and a
`HVDKERAS_HOROVOD_RPATH=...` (where Horovod's library finds a wheel's NCCL, or empty), or exits 1 with an
error that names what is missing and how to get it. A CUDA build of TensorFlow never gets a CPU-only Horovod
in silence.

Where each part comes from, first found wins:
- NCCL: HOROVOD_NCCL_HOME (must hold include/nccl.h and lib/libnccl.so*); a system NCCL (`ldconfig -p`);
  the venv's `nvidia-nccl-cu12` wheel (nvidia/nccl), which `tensorflow[and-cuda]` installs. The wheel
  ships `libnccl.so.2` only, and Horovod's CMake looks for `libnccl.so`, so a NCCL home is assembled in
  WORK_DIR with links to the wheel's files, and linked as a shared library, found at run time through an
  RPATH relative to Horovod's library ($ORIGIN/../../nvidia/nccl/lib: both are in the same site-packages).
- nvcc (Horovod compiles a few CUDA kernels): HOROVOD_CUDA_HOME, then CUDA_HOME (each must hold bin/nvcc);
  nvcc on PATH; /usr/local/cuda; the venv's `nvidia-cuda-nvcc-cu12` wheel where it holds bin/nvcc (a CUDA
  home is assembled from it and `nvidia-cuda-runtime-cu12`). The cu12 wheels of nvcc hold ptxas and
  libnvvm but no nvcc (12.4.131 and 12.9.86 checked), so without a CUDA toolkit the error says so, and names
  scripts/cuda_toolkit.py, which makes one from Debian's CUDA 12.4 packages in the venv.
- The GPUs Horovod's kernels are compiled for (HOROVOD_BUILD_CUDA_CC_LIST, unless set): those TensorFlow was
  built for (60,70,80,89,90 for TensorFlow 2.21), rather than every one nvcc knows.
HOROVOD_GPU_OPERATIONS set to "" forces a CPU-only build; set to NCCL it forces NCCL (with the same checks).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence


class GpuBuildError(RuntimeError):
    """A CUDA build of TensorFlow, and a part Horovod's GPU build needs is missing (named in the message)."""


@dataclasses.dataclass(frozen=True)
class GpuBuild:
    """The GPU part of Horovod's build: its variables, the links to make first, and the wheel cache's tag."""

    operations: str = ""  # "NCCL", or "" for a CPU-only build
    env: tuple[tuple[str, str], ...] = ()
    links: tuple[tuple[str, str], ...] = ()  # (link, target)
    tag: str = "cpu"
    sources: tuple[str, ...] = ()  # where each part came from, for the build's log
    rpath: str = ""  # where Horovod's library finds NCCL at run time, when that is not the system's


def _nccl_version(header: Path) -> str:
    text = header.read_text(errors="replace")
    parts = [re.search(rf"#define\s+NCCL_{name}\s+(\d+)", text) for name in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else "unknown"


def _find_nccl(environ: Mapping[str, str], site_packages: Sequence[Path], ldconfig: str, work: Path):
    """(env, links, version, source) for NCCL, or None."""
    home = environ.get("HOROVOD_NCCL_HOME", "").strip()
    if home:
        header, libs = Path(home, "include", "nccl.h"), list(Path(home, "lib").glob("libnccl.so*"))
        if not header.is_file() or not libs:
            lacks = "no nccl.h" if not header.is_file() else "no libnccl.so"
            raise GpuBuildError(f"HOROVOD_NCCL_HOME must hold include/nccl.h and lib/libnccl.so. Received: "
                                f"HOROVOD_NCCL_HOME={home!r} ({lacks})")
        return [("HOROVOD_NCCL_HOME", home)], [], _nccl_version(header), f"NCCL from HOROVOD_NCCL_HOME={home}"
    if re.search(r"\blibnccl\.so", ldconfig):
        return [], [], "system", "NCCL from the system (ldconfig)"
    for site in site_packages:
        wheel = Path(site, "nvidia", "nccl")
        header, lib = wheel / "include" / "nccl.h", wheel / "lib" / "libnccl.so.2"
        if header.is_file() and lib.is_file():
            nccl_home = work / "nccl"
            links = [(str(nccl_home / "include"), str(wheel / "include")),
                     (str(nccl_home / "lib" / "libnccl.so"), str(lib)),
                     (str(nccl_home / "lib" / "libnccl.so.2"), str(lib))]
            env = [("HOROVOD_NCCL_HOME", str(nccl_home)), ("HOROVOD_NCCL_LINK", "SHARED")]
            return env, links, _nccl_version(header), f"NCCL from the nvidia-nccl-cu12 wheel in {site}"
    return None


# Horovod's TensorFlow library is site-packages/horovod/tensorflow/mpi_lib*.so; the NCCL wheel's library is
# site-packages/nvidia/nccl/lib/libnccl.so.2.
WHEEL_NCCL_RPATH = "$ORIGIN/../../nvidia/nccl/lib"
MAKE_A_TOOLKIT = ("or make one in the venv from Debian's CUDA 12.4 packages: CUDA_HOME=$(python "
                  "scripts/cuda_toolkit.py VENV/bin/python), as `make gpu-build` does")


def _find_nvcc(environ: Mapping[str, str], site_packages: Sequence[Path], which: Callable[[str], str | None],
               exists: Callable[[Path], bool], work: Path):
    """(env, links, source) for nvcc, or None."""
    for name in ("HOROVOD_CUDA_HOME", "CUDA_HOME"):
        home = environ.get(name, "").strip()
        if home:
            if not exists(Path(home, "bin", "nvcc")):
                raise GpuBuildError(f"{name} must be a CUDA toolkit with bin/nvcc. Received: {name}={home!r}")
            return [("HOROVOD_CUDA_HOME", home)], [], f"nvcc from {name}={home}"
    on_path = which("nvcc")
    if on_path:
        home = str(Path(on_path).resolve().parent.parent)
        return [("HOROVOD_CUDA_HOME", home)], [], f"nvcc on PATH ({on_path})"
    if exists(Path("/usr/local/cuda/bin/nvcc")):
        return [("HOROVOD_CUDA_HOME", "/usr/local/cuda")], [], "nvcc from /usr/local/cuda"
    for site in site_packages:
        nvcc_wheel, runtime = Path(site, "nvidia", "cuda_nvcc"), Path(site, "nvidia", "cuda_runtime")
        if exists(nvcc_wheel / "bin" / "nvcc") and exists(runtime / "include" / "cuda_runtime.h"):
            cuda_home = work / "cuda"
            links = [(str(cuda_home / "bin"), str(nvcc_wheel / "bin")),
                     (str(cuda_home / "nvvm"), str(nvcc_wheel / "nvvm")),
                     (str(cuda_home / "include"), str(runtime / "include")),
                     (str(cuda_home / "lib64"), str(runtime / "lib"))]
            source = f"nvcc from the nvidia-cuda-nvcc-cu12 wheel in {site}"
            return [("HOROVOD_CUDA_HOME", str(cuda_home))], links, source
    return None


def nvcc_version(cuda_home: str) -> tuple[str, str] | None:
    """A toolkit's nvcc's CUDA release and full version (("12.4", "12.4.131")), from `nvcc --version` (its line
    "Cuda compilation tools, release 12.4, V12.4.131"); None if it does not run or print them. The one parser of
    nvcc's version, for this script and scripts/cuda_toolkit.py."""
    try:
        out = subprocess.run([str(Path(cuda_home, "bin", "nvcc")), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+), V(\d+(?:\.\d+)+)", out)
    return (match.group(1), match.group(2)) if match else None


def nvcc_release(cuda_home: str) -> str | None:
    """The CUDA release of a toolkit's nvcc ("12.4"); None if it cannot tell."""
    version = nvcc_version(cuda_home)
    return version[0] if version else None


def plan(tf_cuda: bool, environ: Mapping[str, str], site_packages: Sequence[Path], ldconfig: str, work: Path,
         which: Callable[[str], str | None] = shutil.which,
         exists: Callable[[Path], bool] = lambda p: p.is_file(), tf_cuda_version: str | None = None,
         release: Callable[[str], str | None] = nvcc_release,
         tf_compute_capabilities: Sequence[str] = ()) -> GpuBuild:
    """The GPU part of Horovod's build for this environment. Pure but for reading the named folders.

    Raises:
        GpuBuildError: TensorFlow is a CUDA build (or NCCL was forced) and NCCL or nvcc is missing, or nvcc is of
            another CUDA major version than the one TensorFlow was built with (`tf_cuda_version`).
    """
    forced = environ.get("HOROVOD_GPU_OPERATIONS")
    if forced is not None and forced.strip().upper() not in ("", "NCCL"):
        raise GpuBuildError(f"HOROVOD_GPU_OPERATIONS must be NCCL or empty (CPU only). Received: "
                            f"HOROVOD_GPU_OPERATIONS={forced!r}")
    if forced is not None and not forced.strip():
        return GpuBuild(sources=("CPU only: HOROVOD_GPU_OPERATIONS is empty",))
    if forced is None and not tf_cuda:
        return GpuBuild(sources=("CPU only: TensorFlow is not a CUDA build",))
    why = "HOROVOD_GPU_OPERATIONS=NCCL" if forced is not None else "TensorFlow is a CUDA build"
    nccl = _find_nccl(environ, site_packages, ldconfig, work)
    nvcc = _find_nvcc(environ, site_packages, which, exists, work)
    missing = []
    if nccl is None:
        missing.append("NCCL: no HOROVOD_NCCL_HOME, no libnccl in ldconfig, no nvidia-nccl-cu12 wheel in the venv "
                       "(pip install nvidia-nccl-cu12, which tensorflow[and-cuda] installs, or set HOROVOD_NCCL_HOME)")
    if nvcc is None:
        missing.append("nvcc: no HOROVOD_CUDA_HOME or CUDA_HOME, none on PATH or in /usr/local/cuda, and the venv's "
                       "nvidia-cuda-nvcc-cu12 wheel holds ptxas but not nvcc. Install a CUDA 12 toolkit (NVIDIA's "
                       "cuda-toolkit-12 package, or conda's cuda-nvcc) and set CUDA_HOME to it, " + MAKE_A_TOOLKIT)
    if missing:
        raise GpuBuildError(f"{why}, so Horovod must be built with NCCL, and its build is missing:\n- "
                            + "\n- ".join(missing)
                            + "\nTo build a CPU-only Horovod anyway, set HOROVOD_GPU_OPERATIONS= (empty).")
    nccl_env, nccl_links, version, nccl_source = nccl
    nvcc_env, nvcc_links, nvcc_source = nvcc
    cuda_home = dict(nvcc_env)["HOROVOD_CUDA_HOME"]
    found = release(cuda_home) if tf_cuda_version and not nvcc_links else None
    if found and found.split(".")[0] != tf_cuda_version.split(".")[0]:
        raise GpuBuildError(f"{nvcc_source} is CUDA {found}, but TensorFlow was built with CUDA {tf_cuda_version}: "
                            f"Horovod's kernels would link another CUDA runtime. Install a CUDA "
                            f"{tf_cuda_version.split('.')[0]} toolkit and set CUDA_HOME to it"
                            f"{', ' + MAKE_A_TOOLKIT if tf_cuda_version.split('.')[0] == '12' else ''}. Received: "
                            f"HOROVOD_CUDA_HOME={cuda_home}")
    arches = [int(cc.split("_")[1]) for cc in tf_compute_capabilities if re.fullmatch(r"(sm|compute)_\d+", cc)]
    cc_list = [] if "HOROVOD_BUILD_CUDA_CC_LIST" in environ or not arches else [
        ("HOROVOD_BUILD_CUDA_CC_LIST", ",".join(str(cc) for cc in sorted(set(arches))))]
    wheel_nccl = any(link.endswith("libnccl.so") for link, _ in nccl_links)
    return GpuBuild(operations="NCCL", env=(("HOROVOD_GPU_OPERATIONS", "NCCL"), *nccl_env, *nvcc_env, *cc_list),
                    links=(*nccl_links, *nvcc_links), tag=f"nccl{version}", sources=(nccl_source, nvcc_source),
                    rpath=WHEEL_NCCL_RPATH if wheel_nccl else "")


def main(argv: Sequence[str]) -> int:
    work = Path(argv[0]) if argv else Path.cwd()
    try:
        import tensorflow as tf

        tf_cuda = bool(tf.test.is_built_with_cuda())
        build_info = tf.sysconfig.get_build_info()
    except ImportError:
        print("gpu_build.py: error: TensorFlow must be installed before Horovod is built", file=sys.stderr)
        return 1
    import site

    try:
        ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except OSError:
        ldconfig = ""
    try:
        build = plan(tf_cuda, os.environ, [Path(p) for p in site.getsitepackages()], ldconfig, work,
                     tf_cuda_version=build_info.get("cuda_version"),
                     tf_compute_capabilities=build_info.get("cuda_compute_capabilities") or ())
    except GpuBuildError as err:
        print(f"gpu_build.py: error: {err}", file=sys.stderr)
        return 1
    for link, target in build.links:
        Path(link).parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(target, link)
    for source in build.sources:
        print(f"echo {shlex.quote('gpu_build.py: ' + source)}")
    for name, value in build.env:
        print(f"export {name}={shlex.quote(value)}")
    if not build.operations:
        print("unset HOROVOD_GPU_OPERATIONS")
    print(f"GPU_TAG={shlex.quote(build.tag)}")
    print(f"HVDKERAS_HOROVOD_RPATH={shlex.quote(build.rpath)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
