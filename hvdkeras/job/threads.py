"""The priority of the threads Horovod starts.

Horovod moves every tensor from one background thread, which meets the other ranks' background threads once
per coordination cycle, and Gloo adds threads of its own for the transfers. Where the workers' compute fills
the cores, those threads wait for a core each time they wake, and a cycle waits for the slowest rank's
thread: on the two-host lab (docs/network.md) their cycles stalled for 25-36 ms in the backward pass. When
the job spans hosts over Gloo, hvdkeras gives the threads Horovod starts a higher priority (nice -15) where
the process may (root with CAP_SYS_NICE, or an RLIMIT_NICE that allows it); `HVDKERAS_HOROVOD_NICE` sets
another value for any job, or `none` leaves them as Horovod starts them. Measured there, in 13 alternating
pairs of runs: the step was shorter with the priority in 12, by a median of 7 ms (4-8% of a step).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

from hvdkeras import settings

log = logging.getLogger("hvdkeras")

VARIABLE = settings.variable("horovod_nice")
MULTI_HOST_NICE = -15
TASKS = "/proc/self/task"

def thread_ids() -> set[int]:
    """This process's threads (Linux); empty elsewhere, where nothing is reniced."""
    try:
        return {int(task) for task in os.listdir(TASKS)}
    except OSError:
        return set()


def over_gloo(environ: Mapping[str, str]) -> bool:
    """Whether Horovod will coordinate over Gloo: hvdkeras's rendezvous and `horovodrun --gloo` set its
    rendezvous address. (An MPI controller's progress loop, which may poll, was not measured.)"""
    return "HOROVOD_GLOO_RENDEZVOUS_ADDR" in environ or environ.get("HOROVOD_CONTROLLER", "").lower() == "gloo"


def horovod_nice(environ: Mapping[str, str], spans_hosts: bool, gloo: bool | None = None) -> int | None:
    """The nice value for Horovod's threads: HVDKERAS_HOROVOD_NICE when set, else -15 when the job spans
    hosts over Gloo (`gloo`; None reads it from Horovod's variables); None leaves them as they start.

    Raises:
        ValueError: HVDKERAS_HOROVOD_NICE is neither an integer from -20 to 19 nor `none`.
    """
    nice = settings.read(environ).horovod_nice
    if nice is None:
        gloo = over_gloo(environ) if gloo is None else gloo
        return MULTI_HOST_NICE if spans_hosts and gloo else None
    return None if nice == "none" else nice


def start_prioritized(start: Callable[[], Any], nice: int | None) -> list[int]:
    """Runs `start` (which starts Horovod) and gives the threads it started the nice value `nice`.

    Returns the ids of the threads reniced: none when `nice` is None, or when the process may not raise a
    thread's priority (then they keep the creator's, and hvdkeras says so once, at info level).
    """
    before = thread_ids()
    start()
    if nice is None:
        return []
    prioritized = []
    for tid in sorted(thread_ids() - before):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
        except PermissionError:
            log.info("hvdkeras: Horovod's threads keep their priority: nice %d needs CAP_SYS_NICE or an "
                     "RLIMIT_NICE that allows it (%s=none leaves them without trying)", nice, VARIABLE)
            break
        prioritized.append(tid)
    return prioritized


INTER_OP_VARIABLE = "TF_NUM_INTEROP_THREADS"
ONE_INTER_OP_THREAD = (
    "hvdkeras: TensorFlow runs with one inter-op thread ({how}). With one, its executor may compute every weight "
    "gradient after the whole chain of the backward pass, so that no allreduce starts before the pass ends and "
    "a step takes the compute and then the communication (measured on two hosts at 100 Mbit/s: 400-410 ms steps "
    "against 300-320 ms with two threads). Give it two or more: "
    "tf.config.threading.set_inter_op_parallelism_threads(2) before TensorFlow starts, or {variable}=2."
)


def one_inter_op_thread(configured: int, environ: Mapping[str, str], cores: int) -> str | None:
    """How TensorFlow comes to run with a single inter-op thread, or None when it does not.

    Args:
        configured: `tf.config.threading.get_inter_op_parallelism_threads()` (0: TensorFlow chooses).
        environ: the environment (TF_NUM_INTEROP_THREADS).
        cores: the cores this process may run on (TensorFlow's own choice is one thread per core).
    """
    if configured == 1:
        return "tf.config.threading.set_inter_op_parallelism_threads(1)"
    if configured == 0:
        given = environ.get(INTER_OP_VARIABLE, "").strip()
        if given == "1":
            return f"{INTER_OP_VARIABLE}=1"
        if not given and cores == 1:
            return "TensorFlow's choice for a process with one core"
    return None


def check_inter_op_threads(size: int, threading: Any = None, environ: Mapping[str, str] | None = None,
                           cores: int | None = None, say: Callable[[str], None] | None = None) -> str | None:
    """In a job of two or more workers, keeps TensorFlow's executor from running on one inter-op thread.

    Where TensorFlow would choose one itself (a process with one core, nothing set), sets two, which it can
    while its runtime has not started. Where the script or TF_NUM_INTEROP_THREADS asked for one, or the
    runtime has started, says once (`say`, a warning by default) what that costs and how to give it two.
    Returns what was done ("set 2" or the warning), or None.
    """
    if size < 2:
        return None
    if threading is None:
        import tensorflow as tf

        threading = tf.config.threading
    environ = os.environ if environ is None else environ
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    how = one_inter_op_thread(threading.get_inter_op_parallelism_threads(), environ, cores)
    if how is None:
        return None
    if how.startswith("TensorFlow's choice"):
        try:
            threading.set_inter_op_parallelism_threads(2)
            log.info("hvdkeras: two inter-op threads for TensorFlow (it would run one on this process's one core)")
            return "set 2"
        except RuntimeError:  # TensorFlow's runtime has started: too late to change
            pass
    message = ONE_INTER_OP_THREAD.format(how=how, variable=INTER_OP_VARIABLE)
    (say or log.warning)(message)
    return message
