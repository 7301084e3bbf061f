"""Supervising a running job: horovodrun's output passed through, and the root cause of a failure reported.

- `feed` reads horovodrun's rank-prefixed output into a `failures.FailureReport`: each worker's error record
  (a marker line `python -m hvdkeras` prints when the script fails, kept out of the output), the tracebacks,
  lost peers and fatal signals the workers print, and the exits horovodrun reports.
- `StallWatch` watches this host's worker processes: their pids, and one that was stopped (SIGSTOP, suspended).
- `stream` runs horovodrun with both, giving the workers a folder for their error files
  (HVDKERAS_ERROR_DIR); `supervise` runs the workers of one node of the ssh-less multi-node form, with
  horovodrun's output format. On failure each prints `failures.format_report`: the root cause (time, host,
  rank and local rank, the real exit code or signal, pid, error file, the end of the traceback), then the
  other failures; the launcher's own SIGTERM is never a cause.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from hvdkeras import settings
from hvdkeras.cli.startup_log import startup_line
from hvdkeras.failures import RECORD_MARKER, FailureReport, format_report

_FAILED = re.compile(rb"^Process (\d+) exit with status code (-?\d+)")


_RANK_LINE = re.compile(rb"^\[(\d+)\]<std(?:out|err)>:")


def feed(report: FailureReport, line: bytes) -> bool:
    """Reads one line of horovodrun's output into `report`. Returns False for a worker's error record (a marker
    line, not shown), True for a line to pass through."""
    rank_line = _RANK_LINE.match(line)
    if rank_line:
        rank = int(rank_line.group(1))
        text = line[rank_line.end():].decode(errors="replace").rstrip("\n")
        if text.startswith(RECORD_MARKER):
            try:
                report.add_record(json.loads(text[len(RECORD_MARKER):]))
                return False
            except ValueError:
                return True
        report.add_output(rank, text)
    exited = _FAILED.match(line.strip())
    if exited:
        report.add_exit(int(exited.group(1)), int(exited.group(2)))
    return True


class StallWatch:
    """Watches the local worker processes of a job; remembers the ranks whose process was stopped.

    When a worker stops answering, the others fail with a Gloo timeout that cannot say whom they waited
    for; on this host the process table can (a SIGSTOPped or suspended process is in state "stopped").
    """

    def __init__(self, pid: int, interval: float = 0.5):
        self.pid = pid
        self.interval = interval
        self.stopped: set[int] = set()
        self.pids: dict[int, int] = {}  # rank -> pid of each local worker seen
        self.local_ranks: dict[int, int] = {}  # rank -> its local rank
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
            known = set(self.pids.values())
            for child in children:
                try:
                    rank = environ = None
                    if child.pid not in known or child.status() == psutil.STATUS_STOPPED:
                        environ = child.environ()
                        rank = environ.get("HOROVOD_RANK")
                    if rank is None:
                        continue
                    if child.pid not in known and "python" in os.path.basename(child.exe()):
                        self.pids.setdefault(int(rank), child.pid)
                        if environ.get("HOROVOD_LOCAL_RANK", "").isdigit():
                            self.local_ranks.setdefault(int(rank), int(environ["HOROVOD_LOCAL_RANK"]))
                    if child.status() == psutil.STATUS_STOPPED:
                        self.stopped.add(int(rank))
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)


def stream(cmd: list[str], env: dict, name_failed_rank: bool = True, startup_log: bool = False) -> int:
    """Runs horovodrun, passing its rank-prefixed output through (without TensorFlow's C++ start-up lines unless
    `startup_log`: hvdkeras.cli.startup_log); on failure prints the root cause (the rank that failed first, with
    its real exit code or signal, host, pid and the end of its traceback, from the error record each worker
    writes) and the other failures."""
    env = dict(env)
    error_dir = None
    if not env.get(settings.variable("error_dir")):
        error_dir = tempfile.mkdtemp(prefix="hvdkeras-errors-")
        env[settings.variable("error_dir")] = error_dir
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    watch = StallWatch(proc.pid)
    report = FailureReport(stall_timeout=_seconds(env.get("HOROVOD_GLOO_TIMEOUT_SECONDS")))
    out = sys.stdout.buffer
    try:
        for line in iter(proc.stdout.readline, b""):
            if feed(report, line) and (startup_log or not startup_line(line)):
                out.write(line)
                out.flush()
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        code = proc.wait()
    finally:
        watch.close()
    if code != 0:
        report.pids.update(watch.pids)
        report.local_ranks.update(watch.local_ranks)
        report.hosts.update({rank: socket.gethostname() for rank in watch.pids})
        for rank in watch.stopped:
            report.add_stopped(rank)
        text = format_report(report) if name_failed_rank or watch.stopped else ""
        if text:
            print(text, file=sys.stderr, flush=True)
        else:
            print(f"hvdkeras run: the job failed (horovodrun exit code {code}).", file=sys.stderr, flush=True)
    elif error_dir is not None:
        shutil.rmtree(error_dir, ignore_errors=True)
    return code


def _seconds(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def supervise(workers: list[tuple[list[str], dict[str, str]]], grace: float = 5.0, startup_log: bool = False) -> int:
    """Runs this node's workers with rank-prefixed output, as horovodrun prints it (without TensorFlow's C++
    start-up lines unless `startup_log`); returns the job's exit code.

    When a worker fails, the others on this node are stopped (SIGTERM, then SIGKILL after `grace` seconds)
    and the rank that failed first is named; the other nodes' workers fail on their own when their
    collectives lose this node (within the stall timeout).
    """
    out = sys.stdout.buffer
    lock = threading.Lock()
    procs: dict[int, subprocess.Popen] = {}
    report = FailureReport(stall_timeout=_seconds(workers[0][1].get(settings.variable("stall_timeout")))
                           if workers else None)
    given_dir = os.environ.get(settings.variable("error_dir"))
    error_dir = given_dir or tempfile.mkdtemp(prefix="hvdkeras-errors-")

    def pump(rank: int, stream_name: str, pipe) -> None:
        prefix = f"[{rank}]<{stream_name}>:".encode()
        for line in iter(pipe.readline, b""):
            with lock:
                if feed(report, prefix + line) and (startup_log or not startup_line(line)):
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
        env = dict(os.environ, **{settings.variable("error_dir"): error_dir}, **extra)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        procs[rank] = proc
        report.pids[rank] = proc.pid
        report.hosts[rank] = socket.gethostname()
        if str(extra.get("LOCAL_RANK", "")).isdigit():
            report.local_ranks[rank] = int(extra["LOCAL_RANK"])
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
                    report.add_exit(rank, code)
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
        if not given_dir:  # the folder this node made; one the user named is theirs
            shutil.rmtree(error_dir, ignore_errors=True)
        return 0
    for rank, proc in procs.items():
        report.add_exit(rank, proc.returncode)
    print(format_report(report, scope=" on this node"), file=sys.stderr, flush=True)
    code = first[1]
    return code if code > 0 else 128 - code
