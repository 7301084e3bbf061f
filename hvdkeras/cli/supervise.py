"""Supervising a running job: horovodrun's output passed through, and the rank that failed first named.

- `FailureTracker` reads horovodrun's rank-prefixed output and finds the rank that caused a failure.
- `StallWatch` watches this host's worker processes for one that was stopped (SIGSTOP, suspended).
- `stream` runs horovodrun with both; `supervise` runs the workers of one node of the ssh-less
  multi-node form, with horovodrun's output format.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

from hvdkeras.failures import lost_peer

_FAILED = re.compile(rb"^Process (\d+) exit with status code (-?\d+)")


_RANK_LINE = re.compile(rb"^\[(\d+)\]<std(?:out|err)>:")
_TRACEBACK = b"Traceback (most recent call last)"


class FailureTracker:
    """Finds the rank that failed first from horovodrun's output.

    horovodrun reports exits in the order it notices them, and a survivor whose allreduce was torn down can
    exit before the worker that caused it is noticed; horovodrun then terminates the cause, which never
    reports an exit of its own. So ranks whose output shows such a collateral failure only count when no
    other rank failed, and a rank that printed a traceback of its own counts even when it never exited.
    """

    def __init__(self):
        self.exits: list[tuple[int, int]] = []
        self.collateral: set[int] = set()
        self.raised: list[int] = []

    def feed(self, line: bytes) -> None:
        rank_line = _RANK_LINE.match(line)
        if rank_line:
            rank = int(rank_line.group(1))
            if lost_peer(line):  # it failed only because another one did
                self.collateral.add(rank)
            elif _TRACEBACK in line and rank not in self.raised:
                self.raised.append(rank)
        exited = _FAILED.match(line.strip())
        if exited and int(exited.group(2)) != 0:
            self.exits.append((int(exited.group(1)), int(exited.group(2))))

    def first_failure(self) -> tuple[int, int | None] | None:
        """(rank, exit code) of the failure that started it, or None if horovodrun reported none. The exit
        code is None for a rank that raised and was terminated before horovodrun saw it exit."""
        for rank, code in self.exits:
            if rank not in self.collateral:
                return rank, code
        for rank in self.raised:
            if rank not in self.collateral:
                return rank, None
        return self.exits[0] if self.exits else None


class StallWatch:
    """Watches the local worker processes of a job; remembers the ranks whose process was stopped.

    When a worker stops answering, the others fail with a Gloo timeout that cannot say whom they waited
    for; on this host the process table can (a SIGSTOPped or suspended process is in state "stopped").
    """

    def __init__(self, pid: int, interval: float = 0.5):
        self.pid = pid
        self.interval = interval
        self.stopped: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._done.wait(self.interval):
            try:
                children = root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            for child in children:
                try:
                    if child.status() == psutil.STATUS_STOPPED:
                        rank = child.environ().get("HOROVOD_RANK")
                        if rank is not None:
                            self.stopped.add(int(rank))
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)


def stream(cmd: list[str], env: dict, name_failed_rank: bool = True) -> int:
    """Runs horovodrun, passing its rank-prefixed output through; on failure names the rank that failed first
    (or the rank that stopped answering)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    watch = StallWatch(proc.pid)
    failures = FailureTracker()
    out = sys.stdout.buffer
    try:
        for line in iter(proc.stdout.readline, b""):
            out.write(line)
            out.flush()
            if name_failed_rank:
                failures.feed(line)
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        code = proc.wait()
    finally:
        watch.close()
    if code != 0:
        if watch.stopped:
            ranks = ", ".join(str(r) for r in sorted(watch.stopped))
            print(f"hvdkeras run: the job failed: rank {ranks} stopped answering (its process was stopped); the "
                  f"others gave up after waiting {env.get('HOROVOD_GLOO_TIMEOUT_SECONDS', '?')} s "
                  "(--stall-timeout).", file=sys.stderr, flush=True)
        elif failures.first_failure() is not None:
            rank, worker_code = failures.first_failure()
            if worker_code is None:
                how = "it raised; its traceback is above"
            elif worker_code < 0:
                how = f"killed by signal {-worker_code}"
            else:
                how = f"exit code {worker_code}"
            print(f"hvdkeras run: the job failed: rank {rank} failed first ({how}); the other workers were stopped.",
                  file=sys.stderr, flush=True)
        else:
            print(f"hvdkeras run: the job failed (horovodrun exit code {code}).", file=sys.stderr, flush=True)
    return code


def supervise(workers: list[tuple[list[str], dict[str, str]]], grace: float = 5.0) -> int:
    """Runs this node's workers with rank-prefixed output, as horovodrun prints it; returns the job's exit code.

    When a worker fails, the others on this node are stopped (SIGTERM, then SIGKILL after `grace` seconds)
    and the rank that failed first is named; the other nodes' workers fail on their own when their
    collectives lose this node (within the stall timeout).
    """
    out = sys.stdout.buffer
    lock = threading.Lock()
    procs: dict[int, subprocess.Popen] = {}

    def pump(rank: int, stream_name: str, pipe) -> None:
        prefix = f"[{rank}]<{stream_name}>:".encode()
        for line in iter(pipe.readline, b""):
            with lock:
                out.write(prefix + line)
                out.flush()

    def signal_all(sig: int) -> None:
        for proc in procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass

    pumps = []
    for argv, extra in workers:
        rank = int(extra["RANK"])
        proc = subprocess.Popen(argv, env=dict(os.environ, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        procs[rank] = proc
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            thread = threading.Thread(target=pump, args=(rank, name, pipe), daemon=True)
            thread.start()
            pumps.append(thread)
    first: tuple[int, int] | None = None
    try:
        while any(p.poll() is None for p in procs.values()):
            for rank, proc in procs.items():
                code = proc.poll()
                if code not in (None, 0) and first is None:
                    first = (rank, code)
                    signal_all(signal.SIGTERM)
                    deadline = time.monotonic() + grace
                    while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
                        time.sleep(0.1)
                    signal_all(signal.SIGKILL)
            time.sleep(0.1)
    except KeyboardInterrupt:
        signal_all(signal.SIGTERM)
        time.sleep(grace)
        signal_all(signal.SIGKILL)
        return 130
    finally:
        for proc in procs.values():
            proc.wait()
        for thread in pumps:
            thread.join(timeout=5)
    if first is None:
        failed = [(r, p.returncode) for r, p in sorted(procs.items()) if p.returncode != 0]
        first = failed[0] if failed else None
    if first is None:
        return 0
    rank, code = first
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    print(f"hvdkeras run: the job failed: rank {rank} failed first on this node ({how}); this node's other "
          "workers were stopped.", file=sys.stderr, flush=True)
    return code if code > 0 else 128 - code
