"""scripts/patch_torch_init.py: in a Horovod built without PyTorch, `import horovod.torch` fails as the build's
other missing frameworks do, on the lines of Horovod 0.28.1's horovod/torch/__init__.py (recorded 2026-12-05),
and any other source is refused. The build in the venv is checked as `horovodrun --check-build` sees it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import SCRIPTS, load

patch_torch_init = load("patch_torch_init")
SCRIPT = SCRIPTS / "patch_torch_init.py"

TORCH_INIT = """\
from horovod.common.util import check_extension

_MPI_LIB_AVAILABLE = True
try:
    check_extension('horovod.torch', 'HOROVOD_WITH_PYTORCH',
                    __file__, 'mpi_lib_v2')
except Exception as e:
    # MPI libs are missing, but python applications are still available.
    print(e)
    print("Warning! MPI libs are missing, but python applications are still available.")
    _MPI_LIB_AVAILABLE = False

# only import following function when mpi is available.
if _MPI_LIB_AVAILABLE:
    from horovod.torch import elastic
"""


def test_the_extension_check_raises_instead_of_printing():
    text = patch_torch_init.patch(TORCH_INIT)
    assert "except Exception" not in text and "still available" not in text
    check = text.index("check_extension('horovod.torch', 'HOROVOD_WITH_PYTORCH', __file__, 'mpi_lib_v2')\n")
    assert check < text.index("_MPI_LIB_AVAILABLE = True") < text.index("from horovod.torch import elastic")


def test_the_patched_module_raises_the_extensions_error(tmp_path):
    def check_extension(name, variable, path, *args):
        raise ImportError(f"Extension {name} has not been built")

    namespace = {}
    code = patch_torch_init.patch(TORCH_INIT).replace("from horovod.common.util import check_extension\n", "")
    with pytest.raises(ImportError, match="Extension horovod.torch has not been built"):
        exec(compile(code, "horovod/torch/__init__.py", "exec"), {"check_extension": check_extension,
                                                                    "__file__": str(tmp_path / "x")}, namespace)


def test_another_source_is_refused_naming_the_file(tmp_path):
    source = tmp_path / "__init__.py"
    source.write_text(TORCH_INIT.replace("except Exception as e:", "except ImportError as e:"))
    done = subprocess.run([sys.executable, str(SCRIPT), str(source)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and str(source) in done.stderr and "found it 0 times" in done.stderr
    assert "except ImportError" in source.read_text()  # left as it was
    source.write_text(TORCH_INIT)
    assert subprocess.run([sys.executable, str(SCRIPT), str(source)], timeout=60).returncode == 0
    assert source.read_text() == patch_torch_init.patch(TORCH_INIT)


def test_the_installed_build_lists_tensorflow_and_gloo_and_not_pytorch():
    # The venv's own Horovod, as `make install` built it, with torch installed beside it (torchrun's tests).
    horovodrun = Path(sys.executable).parent / "horovodrun"
    done = subprocess.run([str(horovodrun), "--check-build"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert "[X] TensorFlow" in lines and "[X] Gloo" in lines, done.stdout
    assert "[ ] PyTorch" in lines, done.stdout
