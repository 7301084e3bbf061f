"""Horovod's own names (rank, size, process sets, build flags), as Horovod spells them. `init` and `shutdown`
are hvdkeras.training.session's: they also install and undo training's patches."""

from __future__ import annotations

from hvdkeras import _collectives as C

# Horovod's own functions and objects, unchanged.
ProcessSet = C.ProcessSet
global_process_set = C.global_process_set
add_process_set = C.add_process_set
remove_process_set = C.remove_process_set
start_timeline = C.start_timeline
stop_timeline = C.stop_timeline
is_initialized = C.is_initialized
rank = C.rank
size = C.size
local_rank = C.local_rank
local_size = C.local_size
cross_rank = C.cross_rank
cross_size = C.cross_size


def _built(name: str):
    def built() -> bool:
        return C.build_info()[name]

    built.__name__ = f"{name}_built"
    built.__doc__ = f"Whether this Horovod build has {name.upper()} support."
    return built


gloo_built, mpi_built, nccl_built, ddl_built, ccl_built, cuda_built, rocm_built = (
    _built(n) for n in ("gloo", "mpi", "nccl", "ddl", "ccl", "cuda", "rocm"))


def gloo_enabled() -> bool:
    """Whether this job runs on Gloo."""
    return C.enabled_info()["gloo"]


def mpi_enabled() -> bool:
    """Whether this job runs on MPI."""
    return C.enabled_info()["mpi"]


def mpi_threads_supported() -> bool:
    """Whether MPI was initialized with multi-threading support (False when the job does not run on MPI)."""
    return C.enabled_info()["mpi_threads"]


