"""TensorFlow's C++ start-up lines, left out of a job's output by `hvdkeras run` and `make demo`.

A process that runs TensorFlow prints, before anything of its own, lines such as these (absl writes them
before its logging is initialized; which of them appear depends on the CPU and on TF_CPP_MIN_LOG_LEVEL: on
an AVX2 CPU without AVX-512 only the CPU-feature lines, and none at level 2):

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1796515140.758357    3847 port.cc:153] oneDNN custom operations are on. ...
    I0000 00:00:1796515140.788491    3847 cpu_feature_guard.cc:227] This TensorFlow binary is optimized ...
    To enable the following instructions: AVX2 ..., in other operations, rebuild TensorFlow with the ...

once or twice per process, so a 2-worker job opens with a screen of them. Only these lines, informational
(absl's `I` level) and from these two sources, are left out, with or without horovodrun's `[rank]<stream>:`
prefix; warnings and errors from TensorFlow always pass. HVDKERAS_TF_STARTUP_LOG=1 keeps them all.

    horovodrun ... 2>&1 | python -m hvdkeras.cli.startup_log      (what `make demo` runs)

Plain Python, no TensorFlow.
"""

from __future__ import annotations

import os
import re
import sys
from typing import BinaryIO

from hvdkeras import settings

_STARTUP = re.compile(
    rb"^(?:\[\d+\]<std(?:out|err)>:)?"
    rb"(?:WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|I\d{4} \d\d:\d\d:[\d.]+ +\d+ (?:port|cpu_feature_guard)\.cc:\d+\] .*"
    rb"|To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.)"
    rb"\r?\n?$")


def startup_line(line: bytes) -> bool:
    """Whether `line` (one line of a worker's output, maybe rank-prefixed) is a TensorFlow start-up line."""
    return _STARTUP.match(line) is not None


def copy(source: BinaryIO, sink: BinaryIO, keep_startup: bool = False) -> None:
    """Copies `source` to `sink` line by line, flushing each, without the start-up lines unless `keep_startup`."""
    for line in iter(source.readline, b""):
        if keep_startup or not startup_line(line):
            sink.write(line)
            sink.flush()


def main() -> int:
    try:
        keep = settings.read(os.environ).tf_startup_log
    except ValueError as err:
        print(f"hvdkeras.cli.startup_log: {err}", file=sys.stderr)
        keep = True  # the output is never lost over a bad variable
    copy(sys.stdin.buffer, sys.stdout.buffer, keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
