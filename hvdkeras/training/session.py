"""`init` and `shutdown`: forming the job (hvdkeras.job) and the Keras patches of training that go with it."""

from __future__ import annotations

import sys
from typing import Any

from hvdkeras import _collectives as C
from hvdkeras import patches, tf2
from hvdkeras.job import lifecycle
from hvdkeras.job.lifecycle import pin_gpu
from hvdkeras.training import loops, script_writes, sync_batch_norm


def init(comm: Any = None, process_sets: Any = None, pin_gpus: bool = True) -> None:
    """Initializes Horovod for this worker and pins it to one GPU by local rank.

    Where horovodrun did not set Horovod up, the job is formed from the launcher's environment (Slurm's
    srun, OpenMPI's mpirun, MPICH / Intel MPI, torchrun / Kubernetes RANK and WORLD_SIZE; see
    `hvdkeras.job.launchers`): rank 0 hosts Horovod's rendezvous and the others find it. A launcher that
    started N > 1 processes never yields N jobs of size 1: `init` raises instead. When the job spans hosts,
    Horovod's cycle time is 5 ms (unless set), and over Gloo the threads Horovod starts run at nice -15 where
    the process may (`HVDKERAS_HOROVOD_NICE` sets another value, or `none`; see docs/network.md).

    Args:
        comm: an mpi4py communicator or list of ranks, for an MPI build of Horovod (as in Horovod).
        process_sets: `hvdkeras.ProcessSet`s to register, or "dynamic" (as in Horovod).
        pin_gpus: make only the GPU of `local_rank()` visible to TensorFlow (when GPUs exist and the process
            has not chosen its own; see `pin_gpu`).

    Raises:
        ValueError: the launcher's variables, or HVDKERAS_HOROVOD_NICE, are malformed or inconsistent (named in
            the message); more processes on a host than GPUs.
        RuntimeError: the job cannot be formed (unreachable rendezvous, missing ranks, another job on the
            port, ranks disagreeing on the size, or Horovod already initialized with another size).

    Example:
        >>> import hvdkeras as hvd
        >>> hvd.init()
        >>> hvd.rank(), hvd.size()
    """
    lifecycle.start(comm, process_sets)
    if script_writes.from_script(sys._getframe(1)):
        loops.leave_data()  # the script uses the explicit API: under `hvdkeras run` its loops' data is its own
    sync_batch_norm.install()
    tf2.install_variables_call()
    if pin_gpus:
        pin_gpu(C.local_rank(), C.local_size())


def shutdown() -> None:
    """Shuts Horovod down (and rank 0's rendezvous, where hvdkeras formed the job), and undoes the Keras
    patches that `init()` installed."""
    lifecycle.stop()
    patches.uninstall("sync_batch_norm")
    patches.uninstall("optimizer_variables_call")
