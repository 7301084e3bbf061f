"""Reading a launcher's environment into one description of the job: a pure function of the environment.

`detect(environ)` says which launcher started this process, its rank and the job's size, and where the
job's rendezvous is (rank 0 hosts it, see `hvdkeras.rendezvous`). It reads, innermost launcher first:

1. horovodrun (HOROVOD_RANK or HOROVOD_GLOO_RENDEZVOUS_ADDR): Horovod forms the job itself; returns None.
2. OpenMPI's mpirun (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE).
3. MPICH / Intel MPI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS).
4. torchrun / Kubernetes (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Under a
   real torchrun (TORCHELASTIC_USE_AGENT_STORE=True) its agent's store holds MASTER_PORT, so the rendezvous
   port is derived from TORCHELASTIC_RUN_ID and the store's address instead.
5. TF_CONFIG (Kubeflow's TFJob, Ray Train's TensorflowTrainer): the chief, then the workers (`_tf_config`).
6. Slurm's srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST,
   SLURM_STEP_TASKS_PER_NODE, SLURM_JOB_ID, SLURM_STEP_ID).

An inner launcher wins because it runs inside an outer one's allocation (mpirun inside an sbatch job sees
the allocation's SLURM_* variables too). TF_CONFIG is set per process by the platform that started it, so
it comes before Slurm's variables, which reach every process started inside an allocation. Overrides, for
every launcher: HVDKERAS_RENDEZVOUS_ADDR and HVDKERAS_RENDEZVOUS_PORT (else MASTER_ADDR / MASTER_PORT),
HVDKERAS_JOB_ID, HVDKERAS_IFACE (read by the rendezvous), and HVDKERAS_LAUNCHER=none to read no launcher.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
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


def _int(environ: Mapping[str, str], name: str, minimum: int = 0) -> int:
    """A variable that must hold an integer: empty is as wrong as malformed."""
    value = env_int(environ, name, minimum=minimum, error=LaunchEnvError)
    if value is None:
        raise LaunchEnvError(f"{name} must be an integer >= {minimum}. Received: {name}={environ.get(name)!r}")
    return value


def _opt_int(environ: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    return env_int(environ, name, None, minimum=minimum, error=LaunchEnvError)


def expand_hostlist(hostlist: str) -> list[str]:
    """Expands a Slurm host list: "node[01-03,07],gpu-[1-2]x" -> node01 node02 node03 node07 gpu-1x gpu-2x.

    Raises:
        LaunchEnvError: unbalanced brackets or a bad range.
    """
    items, depth, start = [], 0, 0
    for i, ch in enumerate(hostlist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(hostlist[start:i])
            start = i + 1
        if depth not in (0, 1):
            raise LaunchEnvError(f"Cannot read the Slurm host list. Received: {hostlist!r}")
    items.append(hostlist[start:])
    if depth != 0:
        raise LaunchEnvError(f"Cannot read the Slurm host list (unbalanced brackets). Received: {hostlist!r}")
    hosts: list[str] = []
    for item in (s.strip() for s in items):
        if not item:
            continue
        parts = re.split(r"(\[[^\]]*\])", item)
        choices = []
        for part in parts:
            if part.startswith("["):
                choices.append(_expand_range(part[1:-1], hostlist))
            elif part:
                choices.append([part])
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def _expand_range(body: str, hostlist: str) -> list[str]:
    out = []
    for piece in body.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", piece.strip())
        if not match:
            raise LaunchEnvError(f"Cannot read the range [{body}] in the Slurm host list. Received: {hostlist!r}")
        lo, hi = match.group(1), match.group(2) or match.group(1)
        if int(hi) < int(lo):
            raise LaunchEnvError(f"Descending range [{body}] in the Slurm host list. Received: {hostlist!r}")
        width = len(lo)
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def expand_tasks_per_node(spec: str) -> list[int]:
    """Expands SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE: "2(x3),1" -> [2, 2, 2, 1]."""
    out = []
    for piece in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", piece)
        if not match:
            raise LaunchEnvError(f"Cannot read the Slurm tasks per node. Received: {spec!r}")
        out.extend([int(match.group(1))] * int(match.group(2) or 1))
    return out


def derived_port(job_id: str) -> int:
    """A port every process of a job derives alike from its job id (no communication needed)."""
    digest = int(hashlib.sha256(job_id.encode()).hexdigest(), 16)
    return PORT_BASE + digest % PORT_SPAN


def _address(environ: Mapping[str, str], local_size: int | None, size: int,
             launcher_host: tuple[str, str] | None, launcher: str) -> tuple[str, str]:
    """(address, where it came from): an explicit override, else the launcher's, else this host."""
    given = settings.read(environ, LaunchEnvError).rendezvous_addr
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


def _port(environ: Mapping[str, str], job_id: str | None, launcher: str, avoid: frozenset | set = frozenset()) -> int:
    given = settings.read(environ, LaunchEnvError).rendezvous_port
    if given is not None:
        return given
    # MASTER_PORT, unless torchrun's store holds it: then the port is derived, and is not MASTER_PORT.
    if environ.get("MASTER_PORT", "").strip() and not torchrun_agent_holds_master_port(environ):
        port = _int(environ, "MASTER_PORT", minimum=1)
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


def _check_rank(launcher: str, rank_name: str, rank: int, size_name: str, size: int) -> None:
    if rank >= size:
        raise LaunchEnvError(
            f"{launcher}: the rank must be in [0, size). Received: {rank_name}={rank}, {size_name}={size}"
        )


def _finish(environ, *, launcher, names, rank, size, local_rank, local_size, launcher_job, launcher_host=None,
            mpi=False, avoid_ports=frozenset()) -> LaunchEnv | None:
    if size == 1:
        return None
    addr, source = _address(environ, local_size, size, launcher_host, launcher)
    explicit_job = settings.read(environ, LaunchEnvError).job_id
    port = _port(environ, explicit_job or launcher_job, launcher, avoid_ports)
    # Without an id from the launcher, every process still derives the same one from what they share.
    job_id = explicit_job or launcher_job or f"{launcher}:{addr}:{port}"
    addr_var, port_var, job_var = (settings.variable(n) for n in ("rendezvous_addr", "rendezvous_port", "job_id"))
    read = names + tuple(n for n in (addr_var, port_var, "MASTER_ADDR", "MASTER_PORT", job_var) if n not in names)
    return LaunchEnv(launcher=launcher, variables=_read(environ, read), rank=rank, size=size, local_rank=local_rank,
                     local_size=local_size, rendezvous_addr=addr, rendezvous_port=port, addr_source=source,
                     job_id=job_id, mpi=mpi)


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
_CONVENTIONS = (
    _Convention("OpenMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE", ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"), "ompi", True),
    _Convention("MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                ("PMIX_NAMESPACE", "PMI_KVSNAME"), "pmi", True),
    _Convention("torchrun/Kubernetes", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                ("TORCHELASTIC_RUN_ID",), "torch", False),
)


def _read_convention(environ, c: _Convention):
    rank = _int(environ, c.rank)
    size = _int(environ, c.size, 1)
    _check_rank(c.launcher, c.rank, rank, c.size, size)
    job = next((environ[n] for n in c.job_vars if environ.get(n)), None)
    avoid: set[int] = set()
    names = (c.rank, c.size, c.local_rank, c.local_size, *c.job_vars)
    if torchrun_agent_holds_master_port(environ):
        # torchrun names every job without --rdzv-id "none": its store's address tells two jobs apart.
        job = f"{job}@{environ.get('MASTER_ADDR', '')}:{environ.get('MASTER_PORT', '')}"
        avoid = {p for p in [_opt_int(environ, "MASTER_PORT", 1)] if p is not None}
        names += ("TORCHELASTIC_USE_AGENT_STORE",)
    return _finish(environ, launcher=c.launcher, names=names,
                   rank=rank, size=size, local_rank=_opt_int(environ, c.local_rank),
                   local_size=_opt_int(environ, c.local_size, 1),
                   launcher_job=f"{c.job_prefix}-{job}" if job else None, mpi=c.mpi, avoid_ports=avoid)


def _slurm(environ):
    size_name = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
    names = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID",
             "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_STEP_ID")
    rank = _int(environ, "SLURM_PROCID")
    size = _int(environ, size_name, 1)
    _check_rank("Slurm", "SLURM_PROCID", rank, size_name, size)
    nodelist_name = next((n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                          if environ.get(n, "").strip()), None)
    nodes = expand_hostlist(environ[nodelist_name]) if nodelist_name else []
    local_rank = _opt_int(environ, "SLURM_LOCALID")
    tasks_name = next((n for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if environ.get(n)), None)
    node_id = _opt_int(environ, "SLURM_NODEID")
    local_size = None
    if len(nodes) == 1:
        local_size = size
    elif tasks_name is not None and node_id is not None:
        per_node = expand_tasks_per_node(environ[tasks_name])
        local_size = per_node[node_id] if node_id < len(per_node) else None
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID") or "0"
    # One node: stay on loopback. Several: rank 0 runs on the step's first node (block and cyclic layouts).
    launcher_host = None if len(nodes) <= 1 else (nodes[0], nodelist_name)
    return _finish(environ, launcher="Slurm", names=names, rank=rank, size=size, local_rank=local_rank,
                   local_size=local_size, launcher_job=f"slurm-{job}.{step}" if job else None,
                   launcher_host=launcher_host)


TF_CONFIG_TASKS = ("chief", "worker")  # the task types that train, in rank order


def split_address(address: str) -> tuple[str, str]:
    """("host", "port") of "host:port" ("[::1]:80" gives "::1"); the port is "" when there is none."""
    host, _, port = address.strip().rpartition(":")
    return (host.strip("[]"), port) if host else (address.strip().strip("[]"), "")


def _tf_config(environ):
    """TF_CONFIG, as Kubeflow's TFJob, Ray Train's TensorflowTrainer and tf.distribute's platforms set it:
    `{"cluster": {"chief": ["h0:p"], "worker": ["h1:p", "h2:p"]}, "task": {"type": "worker", "index": 0}}`.

    Ranks: the chief first, then the workers in index order. Rank 0's host is the first of those addresses.
    The rendezvous port is not one of the cluster's own ports (a TensorFlow server of the same job may bind
    those): unless MASTER_PORT or HVDKERAS_RENDEZVOUS_PORT says otherwise, every process derives it from the
    cluster spec (`derived_port`), skipping any port the spec lists. Local ranks come from the hosts.
    """
    raw = environ["TF_CONFIG"]
    try:
        config = json.loads(raw)
    except ValueError as err:
        raise LaunchEnvError(f"TF_CONFIG must be JSON with a 'cluster' and a 'task'. Received: TF_CONFIG={raw!r} "
                             f"({err})") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise LaunchEnvError(f"TF_CONFIG must be a JSON object with a 'cluster' and a 'task'. Received: "
                             f"TF_CONFIG={raw!r}")
    kind, index = task.get("type"), task.get("index", 0)
    if cluster.get("ps"):
        raise LaunchEnvError(
            f"TF_CONFIG describes a parameter-server job (its cluster has 'ps' tasks): hvdkeras trains data-"
            f"parallel with 'chief' and 'worker' tasks only. Received: task {kind}:{index} in TF_CONFIG={raw!r}")
    if kind not in TF_CONFIG_TASKS:
        raise LaunchEnvError(
            f"TF_CONFIG's task {kind!r} does not train: hvdkeras forms its job from the 'chief' and 'worker' tasks "
            f"(run an evaluator as a job of its own, without TF_CONFIG). Received: task {kind}:{index} in "
            f"TF_CONFIG={raw!r}")
    addresses = []
    for name in TF_CONFIG_TASKS:
        listed = cluster.get(name) or []
        if isinstance(listed, dict):  # sparse form {"0": "host:port"}
            listed = [listed[k] for k in sorted(listed, key=int)]
        if not isinstance(listed, list) or not all(isinstance(a, str) and a.strip() for a in listed):
            raise LaunchEnvError(f"TF_CONFIG's cluster['{name}'] must be a list of 'host:port' strings. Received: "
                                 f"TF_CONFIG={raw!r}")
        addresses.append(listed)
    chiefs, workers = addresses
    count = len(chiefs) if kind == "chief" else len(workers)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise LaunchEnvError(
            f"TF_CONFIG's task index must be in [0, {count}), the number of '{kind}' tasks in its cluster. "
            f"Received: task {kind}:{index!r} in TF_CONFIG={raw!r}")
    ordered = chiefs + workers
    size = len(ordered)
    rank = index if kind == "chief" else len(chiefs) + index
    hosts = [split_address(a)[0] for a in ordered]
    local_rank, local_size = hosts[:rank].count(hosts[rank]), hosts.count(hosts[rank])
    job = "tfconfig-" + hashlib.sha256(json.dumps(ordered).encode()).hexdigest()[:16]
    listed = [a for tasks in cluster.values() for a in (tasks.values() if isinstance(tasks, dict) else tasks)]
    cluster_ports = {int(p) for p in (split_address(str(a))[1] for a in listed) if p.isdigit()}
    return _finish(environ, launcher="TF_CONFIG", names=("TF_CONFIG",), rank=rank, size=size,
                   local_rank=local_rank, local_size=local_size, launcher_job=job,
                   launcher_host=(hosts[0], "TF_CONFIG"), avoid_ports=cluster_ports)


def detect(environ: Mapping[str, str]) -> LaunchEnv | None:
    """The job this process's launcher started, or None when there is nothing for hvdkeras to form.

    None means: horovodrun set Horovod up already, no launcher is visible, the launcher started a single
    process, or HVDKERAS_LAUNCHER=none.

    Args:
        environ: the process environment (`os.environ`).

    Returns:
        A `LaunchEnv`, or None.

    Raises:
        LaunchEnvError: a launcher's variables are malformed or inconsistent, or a multi-host job gives no
            way to find rank 0; the message names the variables and what to set.

    Example:
        >>> detect({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}).rank
        1
    """
    if (settings.read(environ, LaunchEnvError).launcher or "").lower() in ("none", "off", "0"):
        return None
    if "HOROVOD_RANK" in environ or "HOROVOD_GLOO_RENDEZVOUS_ADDR" in environ:
        return None
    for convention in _CONVENTIONS:
        if convention.rank in environ and convention.size in environ:
            return _read_convention(environ, convention)
    if environ.get("TF_CONFIG", "").strip():
        return _tf_config(environ)
    # SLURM_PROCID alone is also set in an sbatch script's own (batch) step, which is one process: only an
    # srun step (SLURM_STEP_NUM_TASKS) or a step id names a set of tasks.
    if "SLURM_PROCID" in environ and ("SLURM_STEP_NUM_TASKS" in environ or
                                      environ.get("SLURM_STEP_ID", "batch") not in ("batch", "extern")):
        return _slurm(environ)
    return None
