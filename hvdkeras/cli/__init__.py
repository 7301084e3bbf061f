"""The `hvdkeras` command: `parse` (the command line, checked), `command` (the pure horovodrun command or the
node's workers), `supervise` (running it, naming the rank that failed first), `check` (`hvdkeras check`) and
`startup_log` (TensorFlow's start-up lines left out of a job's output, also `python -m
hvdkeras.cli.startup_log`). None of them imports TensorFlow, so the command starts in a fraction of a second.
Nothing is imported here, so that `python -m` runs a submodule that nothing imported before."""

from __future__ import annotations

from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The `hvdkeras` console script (hvdkeras.cli.parse.main)."""
    from hvdkeras.cli.parse import main as run

    return run(argv)


__all__ = ["main"]
