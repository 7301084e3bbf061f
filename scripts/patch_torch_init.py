"""Makes `import horovod.torch` fail in a Horovod built without PyTorch (Horovod 0.28.1).

    patch_torch_init.py TORCH_INIT        (horovod/torch/__init__.py of a Horovod source tree; edits it in place)

Why: built with HOROVOD_WITHOUT_PYTORCH=1, Horovod still ships the horovod.torch package, and its __init__
catches the error that says the extension was not built, prints it with "python applications are still
available", and imports. `horovodrun --check-build` decides whether a framework was built by importing its
package, so it lists "[X] PyTorch" wherever torch is installed (hvdkeras's test install has it, for the
torchrun launcher). The extension's check then raises, as horovod.tensorflow's does when TensorFlow was
left out: `import horovod.torch` fails with "Extension horovod.torch has not been built", and the build's
check lists "[ ] PyTorch".

Exits non-zero, naming the file, when the source is not the one this was written against.
"""

from __future__ import annotations

import sys

from source_patch import SourceChanged, patch_one_file

GUARD = """\
_MPI_LIB_AVAILABLE = True
try:
    check_extension('horovod.torch', 'HOROVOD_WITH_PYTORCH',
                    __file__, 'mpi_lib_v2')
except Exception as e:
    # MPI libs are missing, but python applications are still available.
    print(e)
    print("Warning! MPI libs are missing, but python applications are still available.")
    _MPI_LIB_AVAILABLE = False
"""
CHECKED = """\
# Patched for a build without PyTorch: the extension is required, as horovod.tensorflow requires its own.
check_extension('horovod.torch', 'HOROVOD_WITH_PYTORCH', __file__, 'mpi_lib_v2')
_MPI_LIB_AVAILABLE = True
"""


def patch(text: str) -> str:
    """The guarded extension check becomes a plain one."""
    if text.count(GUARD) != 1:
        raise SourceChanged(f"expected the guarded check_extension block once, found it {text.count(GUARD)} times")
    return text.replace(GUARD, CHECKED)


def main(argv: list[str]) -> int:
    return patch_one_file(argv, "patch_torch_init.py", "TORCH_INIT", patch)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
