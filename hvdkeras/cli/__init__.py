"""The `hvdkeras` command: `parse` (the command line, checked), `command` (the pure horovodrun command or the
node's workers), `supervise` (running it, naming the rank that failed first) and `check` (`hvdkeras check`).
None of them imports TensorFlow, so the command starts in a fraction of a second."""

from hvdkeras.cli.parse import main

__all__ = ["main"]
