"""Gets the CUDA stream of a TensorFlow op without `stream_executor::gpu::AsGpuStreamValue` (Horovod 0.28.1).

    patch_gpu_stream.py MPI_OPS_CC        (horovod/tensorflow/mpi_ops.cc of a Horovod source tree; edits it in place)

Why: Horovod's GPU ops ask TensorFlow for the CUDA stream of each op's device through
`stream_executor::gpu::AsGpuStreamValue(Stream*)`, declared by Horovod itself. TensorFlow 2.21 no longer
exports it, so a CUDA build of Horovod links but does not load ("undefined symbol:
_ZN15stream_executor3gpu16AsGpuStreamValueEPNS_6StreamE"). Its `Stream` now gives the handle itself:
`platform_specific_handle().stream`, the CUstream for CUDA. The code this touches is compiled only with
HAVE_GPU, so CPU builds are unchanged.

Exits non-zero, naming the file, when the source is not the one this was written against.
"""

from __future__ import annotations

import sys
from pathlib import Path

CALL = "stream_executor::gpu::AsGpuStreamValue("
INCLUDES_END = "#endif // TENSORFLOW_VERSION >= 2011000000\n"
HELPER = """
// The CUDA (or HIP) stream behind a TensorFlow stream, from the stream itself.
static inline GpuStreamHandle HvdkerasGpuStream(stream_executor::Stream* stream) {
  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);
}
"""


class SourceChanged(ValueError):
    pass


def patch(text: str) -> str:
    """Every AsGpuStreamValue call becomes HvdkerasGpuStream, defined after TensorFlow's stream.h is included."""
    calls = text.count(CALL)
    if calls < 1 or text.count(INCLUDES_END) != 1:
        raise SourceChanged(f"expected AsGpuStreamValue calls and one '{INCLUDES_END.strip()}', found {calls} calls "
                            f"and {text.count(INCLUDES_END)} of the line")
    return text.replace(INCLUDES_END, INCLUDES_END + HELPER).replace(CALL, "HvdkerasGpuStream(")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: patch_gpu_stream.py MPI_OPS_CC", file=sys.stderr)
        return 2
    source = Path(argv[0])
    try:
        patched = patch(source.read_text())
    except (OSError, SourceChanged) as e:
        print(f"patch_gpu_stream.py: {source}: {e}", file=sys.stderr)
        return 1
    source.write_text(patched)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
