"""scripts/cuda_toolkit.py: a CUDA 12 toolkit from Debian's packages, unpacked as they download, into a venv.

The packages are stand-ins built here with the layout of Debian's nvidia-cuda-toolkit and nvidia-cuda-dev
12.4.1 (recorded 2026-12-03); `make gpu-build` runs the script on the real ones.
"""

import hashlib
import io
import sys
import tarfile

import pytest

from . import SCRIPTS, load

cuda_toolkit = load("cuda_toolkit")
SCRIPT = SCRIPTS / "cuda_toolkit.py"


def deb(files: dict[str, bytes]) -> bytes:
    """A .deb (an ar archive of debian-binary, control.tar.xz and data.tar.xz) holding `files`."""
    def tar(entries):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
            for name, data in entries.items():
                info = tarfile.TarInfo("./" + name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        return buffer.getvalue()

    out = b"!<arch>\n"
    for name, data in (("debian-binary", b"2.0\n"), ("control.tar.xz", tar({"control": b"Package: x\n"})),
                       ("data.tar.xz", tar(files))):
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode() + data
        out += b"\n" if len(data) % 2 else b""
    return out


TOOLS = {source: f"tool {source}".encode() for source in cuda_toolkit.DEB_FILES}


def test_a_packages_files_are_read_as_a_stream():
    package = deb({**TOOLS, "usr/share/doc/nvidia-cuda-toolkit/copyright": b"..."})
    files = cuda_toolkit.deb_files(io.BytesIO(package), set(cuda_toolkit.DEB_FILES))
    assert files == TOOLS
    with pytest.raises(cuda_toolkit.ToolkitError, match=r"the package lacks \['usr/bin/nvlink'\]"):
        cuda_toolkit.deb_files(io.BytesIO(deb({k: v for k, v in TOOLS.items() if k != "usr/bin/nvlink"})),
                               set(cuda_toolkit.DEB_FILES))
    with pytest.raises(cuda_toolkit.ToolkitError, match="not a Debian package .*starts with b'<html>No'"):
        cuda_toolkit.deb_files(io.BytesIO(b"<html>Not Found</html>"), {"usr/bin/ptxas"})


def test_a_package_whose_checksum_differs_is_refused(tmp_path):
    path = tmp_path / "tools.deb"
    path.write_bytes(deb(TOOLS))
    good = hashlib.sha256(path.read_bytes()).hexdigest()
    assert cuda_toolkit.fetch_deb(path.as_uri(), good, {"usr/bin/ptxas"}) == {"usr/bin/ptxas": TOOLS["usr/bin/ptxas"]}
    with pytest.raises(cuda_toolkit.ToolkitError, match=f"has SHA-256 {good}, expected 0000"):
        cuda_toolkit.fetch_deb(path.as_uri(), "0" * 64, {"usr/bin/ptxas"})


def test_the_home_links_the_toolkit_and_the_venvs_own_runtime(tmp_path):
    toolkit = tmp_path / "cache" / "cuda-12.4.131"
    cuda_toolkit.install_files(TOOLS, cuda_toolkit.DEB_FILES, toolkit)
    cuda_toolkit.install_files({k: b"ar" for k in cuda_toolkit.DEV_FILES}, cuda_toolkit.DEV_FILES, toolkit)
    (toolkit / "include").mkdir()
    runtime = tmp_path / "venv" / "nvidia" / "cuda_runtime" / "lib"
    runtime.mkdir(parents=True)
    (runtime / "libcudart.so.12").write_text("")
    home = cuda_toolkit.make_home(toolkit, runtime, tmp_path / "venv" / "cuda-home")
    # nvcc finds include/ and lib64/ from its own path: it is a file of the home, not a link into the cache.
    nvcc = home / "bin" / "nvcc"
    assert not nvcc.is_symlink() and nvcc.read_bytes() == TOOLS["usr/lib/nvidia-cuda-toolkit/bin/nvcc"]
    assert (home / "bin" / "ptxas").resolve() == toolkit / "bin" / "ptxas"
    assert (home / "nvvm" / "bin" / "cicc").stat().st_mode & 0o111
    assert (home / "lib64" / "libcudart.so").resolve() == runtime / "libcudart.so.12"
    assert (home / "lib64" / "libcudadevrt.a").resolve() == toolkit / "lib64" / "libcudadevrt.a"
    assert not (toolkit / "nvvm" / "libdevice" / "libdevice.10.bc").stat().st_mode & 0o111
    # Made again (a second make gpu-build): replaced, not added to.
    again = cuda_toolkit.make_home(toolkit, runtime, tmp_path / "venv" / "cuda-home")
    assert sorted(p.name for p in (again / "lib64").iterdir()) == sorted(
        ["libcudart.so", "libcudart.so.12", "libcudart_static.a", "libcudadevrt.a", "libculibos.a"])


def test_headers_come_from_the_wheels_include_folder(tmp_path):
    import zipfile

    wheel = tmp_path / "nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("nvidia/cuda_runtime/include/cuda_runtime.h", "// runtime")
        archive.writestr("nvidia/cuda_runtime/include/crt/host_config.h", "// crt")
        archive.writestr("nvidia/cuda_runtime/lib/libcudart.so.12", "")
        archive.writestr("nvidia_cuda_runtime_cu12-12.4.127.dist-info/RECORD", "")
    cuda_toolkit.install_wheel_headers(wheel, tmp_path / "toolkit")
    found = sorted(str(p.relative_to(tmp_path / "toolkit")) for p in (tmp_path / "toolkit").rglob("*") if p.is_file())
    assert found == ["include/crt/host_config.h", "include/cuda_runtime.h"]


def test_a_venv_without_tensorflows_cuda_runtime_is_named(tmp_path):
    with pytest.raises(cuda_toolkit.ToolkitError, match="has no nvidia-cuda-runtime-cu12.*tensorflow\\[and-cuda\\]"):
        cuda_toolkit.runtime_lib(sys.executable)  # this venv's TensorFlow is the CPU build


def test_the_archives_are_the_ones_apt_is_configured_with(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# a comment\n"
        "deb [arch=amd64 signed-by=/usr/share/keyrings/a.gpg] http://archive.test/debian bookworm main\n"
        "deb-src http://archive.test/source bookworm main\n"
        "deb http://archive.test/debian/ bookworm-updates main  # the same archive again\n")
    (tmp_path / "sources.list.d" / "extra.list").write_text("deb file:///srv/local-archive stable main\n")
    (tmp_path / "sources.list.d" / "off.list.disabled").write_text("deb http://never.test/debian x main\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb deb-src\n"
        "# http://snapshot.test/archive\n"
        "URIs: http://second.test/debian http://third.test/debian\n"
        "Suites: bookworm\n"
        "Components: main\n"
        "\n"
        "Types: deb\n"
        "URIs: http://disabled.test/debian\n"
        "Enabled: no\n"
        "\n"
        "Types: deb-src\n"
        "URIs: http://source-only.test/debian\n")
    assert cuda_toolkit.apt_archives(tmp_path) == [
        "http://archive.test/debian/", "file:///srv/local-archive/", "http://second.test/debian/",
        "http://third.test/debian/"]
    assert cuda_toolkit.apt_archives(tmp_path / "nothing-here") == []


def test_the_package_comes_from_the_first_archive_whose_pool_has_it(tmp_path):
    name = "tools.deb"
    second = tmp_path / "second"
    (second / cuda_toolkit.POOL).mkdir(parents=True)
    (second / cuda_toolkit.POOL / name).write_bytes(deb(TOOLS))
    digest = hashlib.sha256(deb(TOOLS)).hexdigest()
    archives = [(tmp_path / "first").as_uri() + "/", second.as_uri() + "/"]
    assert cuda_toolkit.fetch_from_archives(archives, (name, digest), {"usr/bin/ptxas"}) == {
        "usr/bin/ptxas": TOOLS["usr/bin/ptxas"]}
    with pytest.raises(cuda_toolkit.ToolkitError, match="has SHA-256"):  # a wrong package is not skipped over
        cuda_toolkit.fetch_from_archives(archives, (name, "0" * 64), {"usr/bin/ptxas"})
    with pytest.raises(cuda_toolkit.ToolkitError) as err:
        cuda_toolkit.fetch_from_archives(archives[:1], (name, digest), {"usr/bin/ptxas"})
    assert f"no archive had {name}" in str(err.value) and archives[0] + cuda_toolkit.POOL + name in str(err.value)
    assert "--archive URL" in str(err.value)
    with pytest.raises(cuda_toolkit.ToolkitError, match="the apt sources name none of type 'deb'.*--archive URL"):
        cuda_toolkit.fetch_from_archives([], (name, digest), {"usr/bin/ptxas"})
