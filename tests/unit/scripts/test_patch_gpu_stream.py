"""scripts/patch_gpu_stream.py: Horovod's GPU ops take the CUDA stream from TensorFlow's Stream itself, on the
lines of Horovod 0.28.1's horovod/tensorflow/mpi_ops.cc (recorded 2026-12-03), and refuse any other source."""

import subprocess
import sys

import pytest

from . import SCRIPTS, load

patch_gpu_stream = load("patch_gpu_stream")
SCRIPT = SCRIPTS / "patch_gpu_stream.py"

MPI_OPS = """\
// Forward declaration of AsGpuStreamValue
namespace stream_executor {
namespace gpu {
GpuStreamHandle AsGpuStreamValue(Stream* stream);
} // namespace stream_executor
} // namespace gpu
#if TENSORFLOW_VERSION >= 2011000000
#include "tensorflow/compiler/xla/stream_executor/stream.h"
#else
#include "tensorflow/stream_executor/stream.h"
#endif // TENSORFLOW_VERSION >= 2011000000
#endif // HAVE_GPU
  auto stream = stream_executor::gpu::AsGpuStreamValue(device_context->stream());
    auto stream = (device_context != nullptr) ? stream_executor::gpu::AsGpuStreamValue(device_context->stream()) : 0;
"""


def test_every_call_takes_the_streams_own_handle():
    text = patch_gpu_stream.patch(MPI_OPS)
    assert "stream_executor::gpu::AsGpuStreamValue(" not in text
    assert text.count("HvdkerasGpuStream(device_context->stream())") == 2
    # Defined once, after TensorFlow's stream.h and inside HAVE_GPU, from platform_specific_handle().
    helper = text.index("static inline GpuStreamHandle HvdkerasGpuStream")
    assert text.index('#include "tensorflow/stream_executor/stream.h"') < helper < text.index("#endif // HAVE_GPU")
    assert "stream->platform_specific_handle().stream" in text


def test_another_source_is_refused(tmp_path):
    with pytest.raises(patch_gpu_stream.SourceChanged, match="found 0 calls"):
        patch_gpu_stream.patch(MPI_OPS.replace("stream_executor::gpu::AsGpuStreamValue(", "other("))
    source = tmp_path / "mpi_ops.cc"
    source.write_text("int main() {}\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(source)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and f"patch_gpu_stream.py: {source}" in done.stderr
    assert source.read_text() == "int main() {}\n"  # left as it was
