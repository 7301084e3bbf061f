"""What the scripts that patch Horovod's sources share (patch_gloo.py, patch_gpu_stream.py, patch_torch_init.py):
the error for a source other than the one a patch was written against, and the command line of a patch of one
file. Scripts run as `python scripts/NAME.py`, so this module, beside them, is on their path."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


class SourceChanged(ValueError):
    """The source is not the one the patch was written against (what it expected, and what it found)."""


def patch_one_file(argv: list[str], prog: str, operand: str, patch: Callable[[str], str]) -> int:
    """`prog OPERAND`: the file's text through `patch`, written back in place. Exits 2 on bad usage, 1 (naming
    the file, leaving it as it was) when it cannot be read or is not the expected source, 0 when patched."""
    if len(argv) != 1:
        print(f"usage: {prog} {operand}", file=sys.stderr)
        return 2
    source = Path(argv[0])
    try:
        patched = patch(source.read_text())
    except (OSError, SourceChanged) as e:
        print(f"{prog}: {source}: {e}", file=sys.stderr)
        return 1
    source.write_text(patched)
    return 0
