"""Reading a launcher's environment into one description of the job: a pure function of the environment.

`detect(environ)` says which launcher started this process, its rank and the job's size, and where the
job's rendezvous is (rank 0 hosts it, see `hvdkeras.job.rendezvous`). It reads, innermost launcher first:

1. horovodrun (HOROVOD_RANK or HOROVOD_GLOO_RENDEZVOUS_ADDR): Horovod forms the job itself; returns None.
2. OpenMPI's mpirun (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE).
3. MPICH / Intel MPI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS).
4. torchrun / Kubernetes (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Under a
   real torchrun (TORCHELASTIC_USE_AGENT_STORE=True) its agent's store holds MASTER_PORT, so the rendezvous
   port is derived from TORCHELASTIC_RUN_ID and the store's address instead.
5. TF_CONFIG (Kubeflow's TFJob, Ray Train's TensorflowTrainer): the chief, then the workers (`read_tf_config`).
6. Slurm's srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST,
   SLURM_STEP_TASKS_PER_NODE, SLURM_JOB_ID, SLURM_STEP_ID).

An inner launcher wins because it runs inside an outer one's allocation (mpirun inside an sbatch job sees
the allocation's SLURM_* variables too). TF_CONFIG is set per process by the platform that started it, so
it comes before Slurm's variables, which reach every process started inside an allocation. Overrides, for
every launcher: HVDKERAS_RENDEZVOUS_ADDR and HVDKERAS_RENDEZVOUS_PORT (else MASTER_ADDR / MASTER_PORT),
HVDKERAS_JOB_ID, HVDKERAS_IFACE (read by the rendezvous), and HVDKERAS_LAUNCHER=none to read no launcher.
"""

from __future__ import annotations

from typing import Mapping

from hvdkeras import settings
from hvdkeras.job.launchers.conventions import CONVENTIONS, read_convention
from hvdkeras.job.launchers.env import (
    LOOPBACK,
    PORT_BASE,
    PORT_SPAN,
    LaunchEnv,
    LaunchEnvError,
    derived_port,
    torchrun_agent_holds_master_port,
)
from hvdkeras.job.launchers.slurm import expand_hostlist, expand_tasks_per_node, read_slurm
from hvdkeras.job.launchers.tf_config import TF_CONFIG_TASKS, read_tf_config, split_address

__all__ = ["LOOPBACK", "PORT_BASE", "PORT_SPAN", "TF_CONFIG_TASKS", "LaunchEnv", "LaunchEnvError", "derived_port",
           "detect", "expand_hostlist", "expand_tasks_per_node", "split_address", "torchrun_agent_holds_master_port"]


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
    for convention in CONVENTIONS:
        if convention.rank in environ and convention.size in environ:
            return read_convention(environ, convention)
    if environ.get("TF_CONFIG", "").strip():
        return read_tf_config(environ)
    # SLURM_PROCID alone is also set in an sbatch script's own (batch) step, which is one process: only an
    # srun step (SLURM_STEP_NUM_TASKS) or a step id names a set of tasks.
    if "SLURM_PROCID" in environ and ("SLURM_STEP_NUM_TASKS" in environ or
                                      environ.get("SLURM_STEP_ID", "batch") not in ("batch", "extern")):
        return read_slurm(environ)
    return None
