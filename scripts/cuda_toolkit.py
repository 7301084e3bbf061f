"""A private CUDA 12 toolkit for Horovod's GPU build, made from packages, with nothing installed system-wide.

    python scripts/cuda_toolkit.py VENV_PYTHON [--archive URL]   (prints the CUDA home to pass as CUDA_HOME)

Horovod compiles a few CUDA kernels with nvcc, and TensorFlow's `nvidia-cuda-nvcc-cu12` wheels hold ptxas but
no nvcc. This assembles a CUDA 12.4 toolkit from:
- Debian's `nvidia-cuda-toolkit` 12.4.131 (non-free): nvcc, cicc, cudafe++, ptxas,
  fatbinary, nvlink, bin2c and libdevice; and from its `nvidia-cuda-dev` 12.4.127, the runtime's static
  libraries that nvcc links by default (libcudart_static.a, libcudadevrt.a, libculibos.a: nvlink refuses a
  libcudadevrt.a newer than itself, as the venv's CUDA 12.9 one is). Unpacked in Python as they download,
  not installed; each checked against its SHA-256. They come from the pool of a Debian archive that the
  machine's apt sources name (/etc/apt/sources.list, and the .list and .sources files of sources.list.d), each
  tried in turn, or from the one `--archive URL` gives.
- NVIDIA's wheels of the same release from PyPI, for their headers: `nvidia-cuda-nvcc-cu12==12.4.131`
  (nvcc's own, crt/), `nvidia-cuda-runtime-cu12==12.4.127` (the runtime's) and `nvidia-cuda-cccl-cu12==12.4.127.post1`
  (libcu++'s nv/target, which cuda_fp16.h includes).

The tools and headers are cached once (HVDKERAS_CACHE_DIR, as for Horovod's wheels). The CUDA home itself is
made in the venv (VENV/cuda-home): links to that cache, and a lib64 that links the venv's own CUDA runtime
(the `nvidia-cuda-runtime-cu12` that TensorFlow installed), so Horovod links the runtime TensorFlow uses.
Code compiled with CUDA 12.4 runs on any later CUDA 12 runtime.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import gpu_build  # beside this script: the one parser of nvcc's version

RELEASE = "12.4.131"
POOL = "pool/non-free/n/nvidia-cuda-toolkit/"  # under an archive's URI
APT = Path("/etc/apt")
TOOLS_DEB = ("nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb",
             "cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319")
DEV_DEB = ("nvidia-cuda-dev_12.4.127~12.4.1-2_amd64.deb",
           "d846838f914a0176948d48a8bcade5d6dbcccb5c9374343f6475f5503f173ee0")
WHEELS = ("nvidia-cuda-nvcc-cu12==12.4.131", "nvidia-cuda-runtime-cu12==12.4.127",
          "nvidia-cuda-cccl-cu12==12.4.127.post1")
# Where each of the .deb's files goes in the toolkit. The .deb's usr/bin/nvcc is a wrapper for Debian's
# layout; the real driver is in usr/lib/nvidia-cuda-toolkit/bin.
DEB_FILES = {
    "usr/lib/nvidia-cuda-toolkit/bin/nvcc": "bin/nvcc",
    "usr/lib/nvidia-cuda-toolkit/bin/crt/link.stub": "bin/crt/link.stub",
    "usr/lib/nvidia-cuda-toolkit/bin/crt/prelink.stub": "bin/crt/prelink.stub",
    "usr/bin/cudafe++": "bin/cudafe++",
    "usr/bin/ptxas": "bin/ptxas",
    "usr/bin/fatbinary": "bin/fatbinary",
    "usr/bin/nvlink": "bin/nvlink",
    "usr/bin/bin2c": "bin/bin2c",
    "usr/lib/nvidia-cuda-toolkit/bin/cicc": "nvvm/bin/cicc",
    "usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc": "nvvm/libdevice/libdevice.10.bc",
}
DEV_FILES = {f"usr/lib/x86_64-linux-gnu/{name}": f"lib64/{name}"
             for name in ("libcudart_static.a", "libcudadevrt.a", "libculibos.a")}
# nvcc reads its profile next to itself: the layout of NVIDIA's own toolkit, with include/ and lib64/ at the top.
PROFILE = """\
TOP              = $(_HERE_)/..
CICC_PATH        = $(TOP)/nvvm/bin
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(CICC_PATH):$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""


class ToolkitError(RuntimeError):
    """The toolkit could not be made (the message says which part and why)."""


class _Hashed(io.RawIOBase):
    """A stream read through once, hashing what passes (so a package is checked as it is unpacked)."""

    def __init__(self, raw):
        self.raw, self.sha256 = raw, hashlib.sha256()

    def readable(self):
        return True

    def readinto(self, buffer):
        data = self.raw.read(len(buffer))
        self.sha256.update(data)
        buffer[:len(data)] = data
        return len(data)


def deb_files(stream, wanted) -> dict[str, bytes]:
    """The files named in `wanted` (paths without the leading './') from a .deb read as a stream; reads to its end."""
    def read(n):
        data = stream.read(n)
        while len(data) < n:
            more = stream.read(n - len(data))
            if not more:
                break
            data += more
        return data

    magic = read(8)
    if magic != b"!<arch>\n":
        raise ToolkitError(f"not a Debian package (an ar archive): it starts with {magic!r}")
    files = {}
    while True:
        header = read(60)
        if len(header) < 60:
            break
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        if name.startswith("data.tar"):
            member = io.BufferedReader(_Limited(stream, size), buffer_size=1 << 20)
            with tarfile.open(fileobj=member, mode="r|*") as tar:
                for entry in tar:
                    path = entry.name.removeprefix("./")
                    if entry.isfile() and path in wanted:
                        files[path] = tar.extractfile(entry).read()
            while member.read(1 << 20):
                pass
            read(size & 1)
        else:
            read(size + (size & 1))
    missing = sorted(set(wanted) - set(files))
    if missing:
        raise ToolkitError(f"the package lacks {missing}")
    return files


class _Limited(io.RawIOBase):
    """The next `size` bytes of a stream."""

    def __init__(self, raw, size):
        self.raw, self.left = raw, size

    def readable(self):
        return True

    def readinto(self, buffer):
        data = self.raw.read(min(len(buffer), self.left)) if self.left else b""
        self.left -= len(data)
        buffer[:len(data)] = data
        return len(data)


def apt_archives(apt: Path = APT) -> list[str]:
    """The URIs of the binary ("deb") archives that apt is configured with, in apt's order, each once.

    Reads one-line sources (sources.list, sources.list.d/*.list: `deb [options] URI suite ...`) and deb822
    ones (sources.list.d/*.sources: `Types:` and `URIs:` fields, stanzas apart by blank lines, `Enabled: no`
    skipped). Files with other endings are ignored, as apt ignores them.
    """
    found: list[str] = []
    part = apt / "sources.list.d"
    lists = [apt / "sources.list", *sorted(part.glob("*.list"))] if part.is_dir() else [apt / "sources.list"]
    for path in lists:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            words = line.split("#", 1)[0].split()
            if words and words[0] == "deb":
                words = words[1:]
                if words and words[0].startswith("["):  # [arch=amd64 signed-by=...]
                    while words and not words[0].endswith("]"):
                        words = words[1:]
                    words = words[1:]
                if words:
                    found.append(words[0])
    for path in sorted(part.glob("*.sources")) if part.is_dir() else []:
        for stanza in path.read_text(errors="replace").split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.lstrip().startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
                found.extend(fields.get("uris", "").split())
    return list(dict.fromkeys(uri.rstrip("/") + "/" for uri in found))


def fetch_from_archives(archives: list[str], deb: tuple[str, str], wanted) -> dict[str, bytes]:
    """`fetch_deb` from the first archive that has the package in its pool; an error naming every URL tried."""
    name, sha256 = deb
    if not archives:
        raise ToolkitError(f"no Debian archive to download {name} from: the apt sources name none of type "
                           f"'deb' ({APT}/sources.list, {APT}/sources.list.d/*.list and *.sources were read); "
                           f"give one with --archive URL")
    failures = []
    for archive in archives:
        url = archive + POOL + name
        try:
            return fetch_deb(url, sha256, wanted)
        except urllib.error.URLError as err:  # not in this archive's pool (or the archive is out of reach)
            failures.append(f"{url}: {getattr(err, 'reason', err)}")
    raise ToolkitError(f"no archive had {name} (Debian's non-free component, {POOL}); tried: "
                       + "; ".join(failures) + ". Give an archive that has it with --archive URL")


def fetch_deb(url: str, sha256: str, wanted) -> dict[str, bytes]:
    """The `wanted` files of the .deb at url, checked against its SHA-256."""
    print(f"cuda_toolkit.py: downloading {url}", file=sys.stderr)
    with urllib.request.urlopen(url, timeout=600) as response:
        hashed = _Hashed(response)
        files = deb_files(io.BufferedReader(hashed, buffer_size=1 << 20), wanted)
        while hashed.read(1 << 20):
            pass
    digest = hashed.sha256.hexdigest()
    if digest != sha256:
        raise ToolkitError(f"{url} has SHA-256 {digest}, expected {sha256}")
    return files


def install_files(files: dict[str, bytes], where: dict[str, str], dest: Path) -> None:
    """Writes each package file to its place in the toolkit (`where`); tools executable."""
    for source, target in where.items():
        path = dest / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[source])
        path.chmod(0o755 if target.startswith(("bin/", "nvvm/bin/")) else 0o644)


def install_wheel_headers(wheel: Path, dest: Path) -> None:
    """Copies a CUDA wheel's include/ folder (nvidia/<part>/include/...) into dest/include."""
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            parts = name.split("/")
            if len(parts) > 3 and parts[0] == "nvidia" and parts[2] == "include" and not name.endswith("/"):
                path = dest / "include" / "/".join(parts[3:])
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(archive.read(name))


def build_cache(cache: Path, python: str, archives: list[str]) -> Path:
    """The tools and headers of the toolkit, made once in cache/cuda-RELEASE."""
    done = cache / f"cuda-{RELEASE}"
    if (done / "bin" / "nvcc").is_file():  # made in a temporary folder, renamed into place when complete
        return done
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        work_dir = Path(work)
        staging = work_dir / "toolkit"
        for deb, where in ((TOOLS_DEB, DEB_FILES), (DEV_DEB, DEV_FILES)):
            install_files(fetch_from_archives(archives, deb, set(where)), where, staging)
        (staging / "bin" / "nvcc.profile").write_text(PROFILE)
        subprocess.run([python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        "-d", str(work_dir / "wheels"), *WHEELS], check=True)
        for wheel in sorted((work_dir / "wheels").glob("*.whl")):
            install_wheel_headers(wheel, staging)
        if done.exists():
            shutil.rmtree(done)
        staging.rename(done)
    return done


def runtime_lib(python: str) -> Path:
    """The venv's `nvidia-cuda-runtime-cu12` lib folder (TensorFlow's CUDA runtime)."""
    out = subprocess.run([python, "-c", "import nvidia.cuda_runtime as m; print(list(m.__path__)[0])"],
                         capture_output=True, text=True)
    lib = Path(out.stdout.strip() or "/nonexistent") / "lib"
    if out.returncode != 0 or not (lib / "libcudart.so.12").is_file():
        raise ToolkitError(f"{python} has no nvidia-cuda-runtime-cu12 with lib/libcudart.so.12 (install "
                           f"tensorflow[and-cuda] first). Received: {out.stderr.strip() or lib}")
    return lib


def make_home(toolkit: Path, runtime: Path, home: Path) -> Path:
    """A CUDA home in `home`: the toolkit's bin, nvvm, include and static libraries, and the venv's shared runtime."""
    if home.exists():
        shutil.rmtree(home)
    (home / "lib64").mkdir(parents=True)
    (home / "bin").mkdir()
    for part in ("nvvm", "include"):
        (home / part).symlink_to(toolkit / part)
    # nvcc finds its profile, and from it include/ and lib64/, by its own resolved path: so nvcc itself is a
    # file of this home (a hard link where it can be), and the rest of bin/ links to the toolkit.
    for tool in sorted((toolkit / "bin").iterdir()):
        if tool.name != "nvcc":
            (home / "bin" / tool.name).symlink_to(tool)
    try:
        os.link(toolkit / "bin" / "nvcc", home / "bin" / "nvcc")
    except OSError:
        shutil.copy2(toolkit / "bin" / "nvcc", home / "bin" / "nvcc")
    for lib in sorted((toolkit / "lib64").iterdir()):
        (home / "lib64" / lib.name).symlink_to(lib)
    for name in ("libcudart.so", "libcudart.so.12"):
        (home / "lib64" / name).symlink_to(runtime / "libcudart.so.12")
    return home


def nvcc_release(home: Path) -> str:
    """Checks that the toolkit's nvcc is RELEASE (gpu_build.nvcc_version reads it); returns RELEASE."""
    version = gpu_build.nvcc_version(str(home))
    if version is None or version[1] != RELEASE:
        raise ToolkitError(f"{home}/bin/nvcc --version must say V{RELEASE}. Received: "
                           f"{'no version' if version is None else 'V' + version[1]}")
    return RELEASE


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cuda_toolkit.py", description=__doc__.splitlines()[0])
    parser.add_argument("python", metavar="VENV_PYTHON", help="the Python of the venv that gets the CUDA home")
    parser.add_argument("--archive", metavar="URL", help="the Debian archive to download the toolkit's packages "
                        "from (default: each archive of the apt sources in turn)")
    args = parser.parse_args(argv)
    python = args.python
    cache = Path(subprocess.run([python, "-c", "from hvdkeras import settings; print(settings.cache_dir())"],
                                capture_output=True, text=True, check=True).stdout.strip())
    venv = Path(subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                               check=True).stdout.strip())
    try:
        archives = [args.archive.rstrip("/") + "/"] if args.archive else apt_archives()
        home = make_home(build_cache(cache, python, archives), runtime_lib(python), venv / "cuda-home")
        nvcc_release(home)
    except (ToolkitError, OSError, subprocess.CalledProcessError) as err:
        print(f"cuda_toolkit.py: error: {err}", file=sys.stderr)
        return 1
    print(home)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
