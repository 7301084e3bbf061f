"""Slurm's srun: SLURM_PROCID, the step's task count, its node list and tasks per node."""

from __future__ import annotations

import itertools
import re

from hvdkeras.job.launchers.env import LaunchEnvError, check_rank, finish, int_variable, optional_int_variable


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


def read_slurm(environ):
    size_name = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
    names = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID",
             "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_STEP_ID")
    rank = int_variable(environ, "SLURM_PROCID")
    size = int_variable(environ, size_name, 1)
    check_rank("Slurm", "SLURM_PROCID", rank, size_name, size)
    nodelist_name = next((n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                          if environ.get(n, "").strip()), None)
    nodes = expand_hostlist(environ[nodelist_name]) if nodelist_name else []
    local_rank = optional_int_variable(environ, "SLURM_LOCALID")
    tasks_name = next((n for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if environ.get(n)), None)
    node_id = optional_int_variable(environ, "SLURM_NODEID")
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
    return finish(environ, launcher="Slurm", names=names, rank=rank, size=size, local_rank=local_rank,
                   local_size=local_size, launcher_job=f"slurm-{job}.{step}" if job else None,
                   launcher_host=launcher_host)
