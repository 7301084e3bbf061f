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

from source_patch import SourceChanged, patch_one_file

CALL = "stream_executor::gpu::AsGpuStreamValue("
INCLUDES_END = "#endif // TENSORFLOW_VERSION >= 2011000000\n"
HELPER = """
// The CUDA (or HIP) stream behind a TensorFlow stream, from the stream itself.
static inline GpuStreamHandle HvdkerasGpuStream(stream_executor::Stream* stream) {
  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);
}
"""


def patch(text: str) -> str:
    """Every AsGpuStreamValue call becomes HvdkerasGpuStream, defined after TensorFlow's stream.h is included."""
    calls = text.count(CALL)
    if calls < 1 or text.count(INCLUDES_END) != 1:
        raise SourceChanged(f"expected AsGpuStreamValue calls and one '{INCLUDES_END.strip()}', found {calls} calls "
                            f"and {text.count(INCLUDES_END)} of the line")
    return text.replace(INCLUDES_END, INCLUDES_END + HELPER).replace(CALL, "HvdkerasGpuStream(")


def main(argv: list[str]) -> int:
    return patch_one_file(argv, "patch_gpu_stream.py", "MPI_OPS_CC", patch)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
