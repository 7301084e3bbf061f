"""The pure part of `hvdkeras run`: a validated RunConfig in, the processes to start out. No I/O.

`build_command` gives horovodrun's command line and environment; `build_node_workers` gives, for the
ssh-less multi-node form, the command and torchrun-style variables of each worker this node starts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

from hvdkeras import settings

DEFAULT_MASTER_PORT = 29500
# Elastic runs: a host whose worker failed may rejoin after 2-3 s, then 4-5 s, ... up to a minute (horovodrun's
# backoff over this range). horovodrun without a range keeps such a host out of the job for good.
DEFAULT_COOLDOWN_RANGE = (1, 60)
MAX_COOLDOWN = 3600  # horovodrun's upper bound


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A checked `hvdkeras run` command line (made by `hvdkeras.cli.parse.validate`)."""

    np: int
    hosts: str
    script: str
    script_args: tuple[str, ...]
    forwarded: tuple[str, ...]
    controller: str
    python: str
    horovodrun: str
    min_np: int | None = None
    max_np: int | None = None
    host_discovery_script: str | None = None
    # Elastic runs: (min, max) seconds a failed host stays blacklisted (horovodrun's --blacklist-cooldown-range).
    cooldown_range: tuple[int, int] | None = None
    stall_timeout: float = 60.0
    # Whether TensorFlow's C++ start-up lines pass through (HVDKERAS_TF_STARTUP_LOG); left out by default.
    startup_log: bool = False
    # The ssh-less multi-node form (started once on every node); nnodes is None for horovodrun runs.
    nnodes: int | None = None
    node_rank: int = 0
    nproc_per_node: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    job_id: str | None = None


def find_horovodrun(which: Callable[[str], str | None], python: str) -> str | None:
    """horovodrun beside `python` (its venv), else the one `which` finds on PATH, else None."""
    beside = os.path.join(os.path.dirname(python), "horovodrun")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return which("horovodrun")


def build_node_workers(config: RunConfig) -> list[tuple[list[str], dict[str, str]]]:
    """The ssh-less multi-node form: (argv, extra env) of each worker this node starts. Pure: no I/O.

    Every worker gets the torchrun / Kubernetes variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT), from which `hvdkeras.init()` forms the job with the other nodes.
    """
    assert config.nnodes is not None
    argv = [config.python, "-m", "hvdkeras", *config.forwarded, config.script, *config.script_args]
    workers = []
    for local_rank in range(config.nproc_per_node):
        env = {
            "RANK": str(config.node_rank * config.nproc_per_node + local_rank),
            "WORLD_SIZE": str(config.np),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
            "MASTER_ADDR": config.master_addr,
            "MASTER_PORT": str(config.master_port),
            "PYTHONUNBUFFERED": "1",
            settings.variable("stall_timeout"): f"{config.stall_timeout:g}",
        }
        if config.job_id is not None:
            env[settings.variable("job_id")] = config.job_id
        workers.append((argv, env))
    return workers


def build_command(config: RunConfig) -> tuple[list[str], dict[str, str]]:
    """The horovodrun command line and extra environment for a run. Pure: no I/O."""
    argv = [config.horovodrun, "-np", str(config.np)]
    if config.host_discovery_script is not None:
        if config.min_np is not None:
            argv += ["--min-np", str(config.min_np)]
        if config.max_np is not None:
            argv += ["--max-np", str(config.max_np)]
        argv += ["--host-discovery-script", config.host_discovery_script]
        if config.cooldown_range is not None:
            argv += ["--blacklist-cooldown-range", *map(str, config.cooldown_range)]
    else:
        argv += ["-H", config.hosts]
    argv.append("--gloo" if config.controller == "gloo" else "--mpi")
    # "--" ends horovodrun's options for its parser: without it a script option that abbreviates two of
    # horovodrun's (--log: --log-level, --log-with-timestamp, ...) stops the job before it starts.
    argv += [config.python, "-m", "hvdkeras", *config.forwarded, "--", config.script, *config.script_args]
    return argv, {"PYTHONUNBUFFERED": "1", **settings.horovod_stall_environ(config.stall_timeout)}
