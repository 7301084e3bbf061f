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
