"""What every launcher convention shares: the job's description (LaunchEnv), its error, reading integers,
and where the rendezvous is (an override, the launcher's, or this host) and on which port."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Mapping

from hvdkeras import settings
from hvdkeras._checks import env_int

LOOPBACK = "127.0.0.1"
# Rendezvous ports derived from a job id fall in [PORT_BASE, PORT_BASE + PORT_SPAN): above the usual
# service ports and below Linux's default ephemeral range (32768-60999), so a derived port is rarely taken.
PORT_BASE = 20000
PORT_SPAN = 12000


@dataclasses.dataclass(frozen=True)
class LaunchEnv:
    """What a launcher told this process about its job.

    Attributes:
        launcher: the launcher's name, for messages ("Slurm", "OpenMPI", ...).
        variables: the environment variables that were read, as NAME=value, for messages.
        rank: this process's rank in [0, size).
        size: how many processes the launcher started.
        local_rank: this process's rank on its host, when the launcher says it.
        local_size: processes on this host, when the launcher says it.
        rendezvous_addr: host name or address of the rendezvous (rank 0 hosts it).
        rendezvous_port: its TCP port.
        addr_source: where the address came from ("MASTER_ADDR", "SLURM_STEP_NODELIST", ...).
        job_id: identifies this job; a worker of another job is never admitted.
        mpi: the launcher is an MPI launcher (an MPI build of Horovod forms such a job by itself).
    """

    launcher: str
    variables: tuple[str, ...]
    rank: int
    size: int
    local_rank: int | None
    local_size: int | None
    rendezvous_addr: str
    rendezvous_port: int
    addr_source: str
    job_id: str
    mpi: bool = False

    def describe(self) -> str:
        return f"{self.launcher} ({', '.join(self.variables)})"


class LaunchEnvError(ValueError):
    """The launcher's environment is inconsistent or incomplete; the message says what to set."""


def int_variable(environ: Mapping[str, str], name: str, minimum: int = 0) -> int:
    """A variable that must hold an integer: empty is as wrong as malformed."""
    value = env_int(environ, name, minimum=minimum, error=LaunchEnvError)
    if value is None:
        raise LaunchEnvError(f"{name} must be an integer >= {minimum}. Received: {name}={environ.get(name)!r}")
    return value


def optional_int_variable(environ: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    return env_int(environ, name, None, minimum=minimum, error=LaunchEnvError)


def derived_port(job_id: str) -> int:
    """A port every process of a job derives alike from its job id (no communication needed)."""
    digest = int(hashlib.sha256(job_id.encode()).hexdigest(), 16)
    return PORT_BASE + digest % PORT_SPAN


def _address(environ: Mapping[str, str], given: str | None, local_size: int | None, size: int,
             launcher_host: tuple[str, str] | None, launcher: str) -> tuple[str, str]:
    """(address, where it came from): `given` (HVDKERAS_RENDEZVOUS_ADDR), else MASTER_ADDR, else the launcher's,
    else this host."""
    if given:
        return given, settings.variable("rendezvous_addr")
    if environ.get("MASTER_ADDR", "").strip():
        return environ["MASTER_ADDR"].strip(), "MASTER_ADDR"
    if launcher_host is not None:
        return launcher_host
    if local_size == size:
        return LOOPBACK, "all ranks on this host"
    where = (f"started {size} processes, {local_size} on this host," if local_size is not None
             else f"started {size} processes without saying how many run on this host,")
    raise LaunchEnvError(
        f"{launcher} {where} and does not say where rank 0 runs, so the workers cannot find the job's "
        "rendezvous. Set MASTER_ADDR (or HVDKERAS_RENDEZVOUS_ADDR) to rank 0's host name or address in every "
        "process (mpirun: -x MASTER_ADDR=node1)."
    )


def torchrun_agent_holds_master_port(environ: Mapping[str, str]) -> bool:
    """torchrun's agent hosts its own TCPStore on MASTER_PORT and tells its workers so."""
    return environ.get("TORCHELASTIC_USE_AGENT_STORE", "").strip().lower() == "true"


def _port(environ: Mapping[str, str], given: int | None, job_id: str | None, launcher: str,
          avoid: frozenset | set = frozenset()) -> int:
    """The rendezvous port: `given` (HVDKERAS_RENDEZVOUS_PORT), else MASTER_PORT, else derived from the job id."""
    if given is not None:
        return given
    # MASTER_PORT, unless torchrun's store holds it: then the port is derived, and is not MASTER_PORT.
    if environ.get("MASTER_PORT", "").strip() and not torchrun_agent_holds_master_port(environ):
        port = int_variable(environ, "MASTER_PORT", minimum=1)
        if port > 65535:
            raise LaunchEnvError(f"MASTER_PORT must be a TCP port in [1, 65535]. Received: "
                                 f"MASTER_PORT={environ['MASTER_PORT']!r}")
        return port
    if job_id is None:
        raise LaunchEnvError(
            f"{launcher}: no MASTER_PORT (or HVDKERAS_RENDEZVOUS_PORT) and no job id to derive a port from. "
            "Set MASTER_PORT to a free TCP port on rank 0's host, the same in every process."
        )
    port = derived_port(job_id)
    while port in avoid:  # a port the launcher gave someone else (TF_CONFIG's servers)
        port = PORT_BASE + (port - PORT_BASE + 1) % PORT_SPAN
    return port


def _read(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{n}={environ[n]}" for n in names if n in environ)


def check_rank(launcher: str, rank_name: str, rank: int, size_name: str, size: int) -> None:
    if rank >= size:
        raise LaunchEnvError(
            f"{launcher}: the rank must be in [0, size). Received: {rank_name}={rank}, {size_name}={size}"
        )


def finish(environ, *, launcher, names, rank, size, local_rank, local_size, launcher_job, launcher_host=None,
            mpi=False, avoid_ports=frozenset()) -> LaunchEnv | None:
    if size == 1:
        return None
    ours = settings.read(environ, LaunchEnvError)
    addr, source = _address(environ, ours.rendezvous_addr, local_size, size, launcher_host, launcher)
    explicit_job = ours.job_id
    port = _port(environ, ours.rendezvous_port, explicit_job or launcher_job, launcher, avoid_ports)
    # Without an id from the launcher, every process still derives the same one from what they share.
    job_id = explicit_job or launcher_job or f"{launcher}:{addr}:{port}"
    addr_var, port_var, job_var = (settings.variable(n) for n in ("rendezvous_addr", "rendezvous_port", "job_id"))
    read = names + tuple(n for n in (addr_var, port_var, "MASTER_ADDR", "MASTER_PORT", job_var) if n not in names)
    return LaunchEnv(launcher=launcher, variables=_read(environ, read), rank=rank, size=size, local_rank=local_rank,
                     local_size=local_size, rendezvous_addr=addr, rendezvous_port=port, addr_source=source,
                     job_id=job_id, mpi=mpi)
