"""Launchers that name rank, size and local rank/size in variables of their own: OpenMPI, MPICH / Intel MPI,
and torchrun / Kubernetes."""

from __future__ import annotations

import dataclasses

from hvdkeras.job.launchers.env import (
    check_rank,
    finish,
    int_variable,
    optional_int_variable,
    torchrun_agent_holds_master_port,
)


@dataclasses.dataclass(frozen=True)
class _Convention:
    """A launcher that names rank, size and local rank/size in variables of its own."""

    launcher: str
    rank: str
    size: str
    local_rank: str
    local_size: str
    job_vars: tuple[str, ...]  # the first one set names the job
    job_prefix: str
    mpi: bool


# Innermost launcher first (see the module docstring). OpenMPI 4 names the job in OMPI_MCA_ess_base_jobid,
# OpenMPI 5 (PMIx) in PMIX_NAMESPACE.
CONVENTIONS = (
    _Convention("OpenMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE", ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"), "ompi", True),
    _Convention("MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                ("PMIX_NAMESPACE", "PMI_KVSNAME"), "pmi", True),
    _Convention("torchrun/Kubernetes", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                ("TORCHELASTIC_RUN_ID",), "torch", False),
)


def read_convention(environ, c: _Convention):
    rank = int_variable(environ, c.rank)
    size = int_variable(environ, c.size, 1)
    check_rank(c.launcher, c.rank, rank, c.size, size)
    job = next((environ[n] for n in c.job_vars if environ.get(n)), None)
    avoid: set[int] = set()
    names = (c.rank, c.size, c.local_rank, c.local_size, *c.job_vars)
    if torchrun_agent_holds_master_port(environ):
        # torchrun names every job without --rdzv-id "none": its store's address tells two jobs apart.
        job = f"{job}@{environ.get('MASTER_ADDR', '')}:{environ.get('MASTER_PORT', '')}"
        avoid = {p for p in [optional_int_variable(environ, "MASTER_PORT", 1)] if p is not None}
        names += ("TORCHELASTIC_USE_AGENT_STORE",)
    return finish(environ, launcher=c.launcher, names=names,
                   rank=rank, size=size, local_rank=optional_int_variable(environ, c.local_rank),
                   local_size=optional_int_variable(environ, c.local_size, 1),
                   launcher_job=f"{c.job_prefix}-{job}" if job else None, mpi=c.mpi, avoid_ports=avoid)
