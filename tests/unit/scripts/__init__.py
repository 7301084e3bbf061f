"""Unit tests of scripts/, each loaded by path (`load`), with scripts/ on the path as when they run."""

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"
# nccl.h of the nvidia-nccl-cu12 wheel tensorflow[and-cuda]==2.21.0 installs (2.32.3), as far as it is read.
NCCL_H = "#define NCCL_MAJOR 2\n#define NCCL_MINOR 32\n#define NCCL_PATCH 3\n"


def load(name: str):
    """scripts/<name>.py as module `name` (registered, so that its dataclasses can look their module up). Its
    imports of the scripts beside it resolve as when it runs as `python scripts/<name>.py`: scripts/ is on the path."""
    if str(SCRIPTS) not in sys.path:
        sys.path.append(str(SCRIPTS))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def layout(root: Path, files: list[str]) -> Path:
    """Empty files at these paths under root (nccl.h with NCCL_H): a recorded install layout."""
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(NCCL_H if name.endswith("nccl.h") else "")
    return root
