"""Failures: what a worker's error says when it failed because a peer went away or the network did, each
worker's error record, and the launcher's report of the root cause.

`lost_peer` is the one list of the lost-peer markers: the supervisor (which rank failed first), the lost-job
diagnosis (whether to probe the peers) and elastic training (whether to restore and go on) all read a failure
with it. `error_record` / `write_error_record` are the worker's side (`python -m hvdkeras` writes one when the
script fails), `FailureReport` / `format_report` the launcher's. Plain Python, so `hvdkeras run` reads it without
TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
from typing import Any

LOST_PEER_MARKERS = (
    "Horovod has been shut down", "HorovodInternalError", "Gloo", "gloo", "Connection reset", "Connection closed",
    "Connection refused", "No route to host", "Timed out", "timed out",
)
_LOST_PEER_BYTES = tuple(marker.encode() for marker in LOST_PEER_MARKERS)


def lost_peer(text: str | bytes) -> bool:
    """Whether `text` (an error message, or a line of a worker's output) shows a lost peer."""
    markers = _LOST_PEER_BYTES if isinstance(text, bytes) else LOST_PEER_MARKERS
    return any(marker in text for marker in markers)


# ---- failure reports: each worker's error record, and the launcher's root cause --------------------------------

RECORD_MARKER = "hvdkeras-error-record: "
TRACEBACK_LINES = 15
# Horovod's stall inspector (on rank 0) lists the ranks a collective waits for after a line "Missing ranks:", one
# line each: "R: [tensor, ...]", with "R!" for a rank it shuts the job down for.
_MISSING_RANK = re.compile(r"^(\d+)(!?): \[(.*)\]$")
# A worker stopped by its launcher after another one failed (horovodrun's or supervise's SIGTERM): never a cause.
_TERMINATED = (-signal.SIGTERM, 128 + signal.SIGTERM)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_signal(code: int | None) -> int | None:
    """The signal that ended a worker, from its exit status as a launcher reports it (-N, or 128 + N from a
    shell in between), or None for an exit code of its own."""
    if code is None:
        return None
    if code < 0:
        return -code
    if 128 < code < 128 + 65:
        return code - 128
    return None


def describe_exit(code: int | None) -> str:
    sig = exit_signal(code)
    if code is None:
        return "no exit status"
    return f"signal {signal_name(sig)}" if sig is not None else f"exit code {code}"


def error_record(exitcode: int, traceback_text: str, environ: Any = None) -> dict:
    """This worker's error record: rank, local rank, host, pid, time, its real exit code, and the last lines of
    its traceback. The rank comes from the launcher's variables (horovodrun's, torchrun's)."""
    env = os.environ if environ is None else environ
    rank = env.get("HOROVOD_RANK", env.get("RANK"))
    local_rank = env.get("HOROVOD_LOCAL_RANK", env.get("LOCAL_RANK"))
    return {"rank": None if rank is None else int(rank), "local_rank": None if local_rank is None else int(local_rank),
            "host": socket.gethostname(), "pid": os.getpid(), "time": time.time(), "exitcode": int(exitcode),
            "traceback": "\n".join(traceback_text.rstrip().splitlines()[-TRACEBACK_LINES:])}


def write_error_record(record: dict, directory: str | None, stream: Any = None) -> str | None:
    """Writes the record into `directory` (rank<R>.json, atomically; made if missing) and as one marker line on
    `stream` (default: standard error), which reaches the launcher from any host. Returns the file's path, or
    None where there is no directory or it cannot be written."""
    path = None
    if directory and record.get("rank") is not None:
        try:
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, f"rank{record['rank']}.json")
            record = dict(record, error_file=path)
            with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp") as f:
                json.dump(record, f)
            os.replace(f.name, path)
        except OSError:
            path = None
    out = sys.stderr if stream is None else stream
    out.write(RECORD_MARKER + json.dumps(record) + "\n")
    out.flush()
    return path


@dataclasses.dataclass
class Failure:
    """One worker's failure as the launcher saw it."""

    rank: int
    time: float
    exitcode: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    traceback: str = ""
    error_file: str | None = None
    collateral: bool = False  # it failed because a peer went away or stopped answering
    stalled: str | None = None  # it stopped answering: how it was found
    missing: list[str] = dataclasses.field(default_factory=list)  # the tensors the others waited for it to submit


class FailureReport:
    """Collects what a launcher sees of a job's failures and names the root cause: the first failure in time
    that is not a consequence of another (a lost peer, the launcher's own SIGTERM).

    Fed with: the workers' error records (marker lines, from any host), their exits (status as the launcher
    got it, the time it saw it), the fatal-signal tracebacks Python's faulthandler printed, the pids of the
    local workers, and the ranks found stopped.
    """

    def __init__(self, stall_timeout: float | None = None):
        self.stall_timeout = stall_timeout
        self.records: dict[int, dict] = {}
        self.exits: dict[int, tuple[int, float]] = {}
        self.fatal: dict[int, list[str]] = {}
        self.raised: dict[int, float] = {}
        self.lost: set[int] = set()
        self.pids: dict[int, int] = {}
        self.hosts: dict[int, str] = {}
        self.local_ranks: dict[int, int] = {}  # of the workers the launcher watches on its own host
        self.stopped: dict[int, float] = {}
        self.missing: dict[int, list[str]] = {}  # rank -> tensors, from Horovod's stall inspector
        self.shut_down_for: set[int] = set()  # the ranks the stall inspector ended the job for
        self._listing: set[int] = set()  # ranks whose output is in a list of missing ranks
        self._seen: dict[tuple[str, int], int] = {}

    def _note(self, what: str, rank: int) -> float:
        self._seen.setdefault((what, rank), len(self._seen))
        return time.time()

    def add_record(self, record: dict) -> None:
        if record.get("rank") is not None and int(record["rank"]) not in self.records:
            self._note("record", int(record["rank"]))
            self.records[int(record["rank"])] = record

    def add_exit(self, rank: int, code: int, seen: float | None = None) -> None:
        if code != 0 and rank not in self.exits:
            now = self._note("exit", rank)
            self.exits[rank] = (code, now if seen is None else seen)

    def add_output(self, rank: int, text: str) -> None:
        """A line a worker printed: a traceback's start, a lost peer's message, faulthandler's report of a fatal
        signal (kept, for a worker that leaves no record), Horovod's list of the ranks a collective waits for."""
        if rank in self._listing:
            missing = _MISSING_RANK.match(text.strip())
            if missing:
                late = int(missing.group(1))
                self.missing[late] = [name for name in missing.group(3).split(", ") if name]
                if missing.group(2):
                    self.shut_down_for.add(late)
                return
            self._listing.discard(rank)
        if text.rstrip().endswith("Missing ranks:"):
            self._listing.add(rank)
            return
        if "Fatal Python error:" in text:
            self.fatal[rank] = [text]
        elif rank in self.fatal and len(self.fatal[rank]) < 4 * TRACEBACK_LINES:
            self.fatal[rank].append(text)
        if lost_peer(text):  # it failed only because another one did
            self.lost.add(rank)
        elif "Traceback (most recent call last)" in text and rank not in self.raised:
            self.raised[rank] = self._note("raised", rank)

    def add_stopped(self, rank: int) -> None:
        if rank not in self.stopped:
            self.stopped[rank] = self._note("stopped", rank)

    def failures(self) -> list[Failure]:
        """Every failure seen, the root cause first, then the others in the order they happened."""
        found: dict[int, Failure] = {}
        for rank, rec in self.records.items():
            found[rank] = Failure(
                rank=rank, time=float(rec.get("time") or 0), exitcode=rec.get("exitcode"),
                local_rank=rec.get("local_rank"), host=rec.get("host"), pid=rec.get("pid"),
                traceback=rec.get("traceback") or "", error_file=rec.get("error_file"),
                collateral=lost_peer(rec.get("traceback") or ""))
        for rank, seen in self.stopped.items():
            found[rank] = Failure(rank=rank, time=seen, pid=self.pids.get(rank), host=self.hosts.get(rank),
                                  local_rank=self.local_ranks.get(rank),
                                  stalled="its process was stopped (SIGSTOP or suspended)")
        for rank in sorted(set(self.exits) | set(self.raised)):
            code, seen = self.exits.get(rank, (None, self.raised.get(rank, 0.0)))
            if rank in found or (code in _TERMINATED and rank not in self.raised):
                continue
            if rank in self.raised:  # it printed a traceback: the launcher's SIGTERM, if any, came after
                code, seen = (None if code in _TERMINATED else code), min(seen, self.raised[rank])
            fatal = self.fatal.get(rank, [])
            found[rank] = Failure(rank=rank, time=seen, exitcode=code, pid=self.pids.get(rank),
                                  host=self.hosts.get(rank), local_rank=self.local_ranks.get(rank),
                                  traceback="\n".join(fatal[-TRACEBACK_LINES:]),
                                  collateral=rank in self.lost)
        causes = [f for f in found.values() if not f.collateral]
        if not causes and found:
            # Every failure was a lost peer: a worker that failed on its own is missing, so the one that hung is a
            # rank that did not fail by itself (no record, or only the launcher's SIGTERM): the one Horovod's stall
            # inspector shut the job down for, else one it listed as missing, else any such rank.
            lost = min(f.time for f in found.values())
            bound = f"the stall bound, --stall-timeout {self.stall_timeout:g} s" if self.stall_timeout else \
                "the stall bound, --stall-timeout"
            listed = sorted(self.shut_down_for) or sorted(self.missing)
            for rank in listed or sorted(set(self.exits) | set(self.pids)):
                if rank in found and rank not in listed:
                    continue
                how = ("it stopped submitting collectives and the others waited for it" if rank in self.missing
                       else "the other workers timed out waiting for it")
                found[rank] = Failure(
                    rank=rank, time=lost, pid=self.pids.get(rank), host=self.hosts.get(rank),
                    local_rank=self.local_ranks.get(rank), missing=self.missing.get(rank, []),
                    stalled=f"{how} ({bound})")
        order = {rank: min((n for (_, r), n in self._seen.items() if r == rank), default=0) for rank in found}
        return sorted(found.values(), key=lambda f: (f.collateral, f.time, order[f.rank], f.rank))

    def root_cause(self) -> Failure | None:
        failures = self.failures()
        return failures[0] if failures else None


def _how(failure: Failure) -> str:
    if failure.stalled:
        return "stopped answering: " + failure.stalled
    if failure.exitcode is None:
        return "it raised; its traceback is above"
    return describe_exit(failure.exitcode)


def _exit_line(failure: Failure) -> str:
    if failure.stalled and failure.exitcode is None:
        return "none of its own: the launcher stopped it after the others failed"
    return _how(failure)


def format_report(report: FailureReport, scope: str = "") -> str:
    """The launcher's report, torchrun's way: the root cause in full, then one line per other failure."""
    failures = report.failures()
    if not failures:
        return ""
    root, others = failures[0], failures[1:]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(root.time)) if root.time else "unknown"
    lines = [f"hvdkeras run: the job failed: rank {root.rank} failed first{scope} ({_how(root)}); the other "
             "workers were stopped.",
             "Root cause (first observed failure):",
             f"  time       : {when}",
             f"  host       : {root.host or 'unknown'}",
             f"  rank       : {root.rank} (local rank {'unknown' if root.local_rank is None else root.local_rank})",
             f"  exit       : {_exit_line(root)} (pid {root.pid or 'unknown'})"]
    if root.missing:
        lines.append(f"  missing    : {', '.join(root.missing)} (the collectives the others waited for it in)")
    if root.error_file:
        lines.append(f"  error file : {root.error_file}")
    if root.traceback:
        lines.append("  traceback  :")
        lines += ["    " + line for line in root.traceback.splitlines()]
    if others:
        lines.append("Other failures:")
        for f in others:
            last = f.traceback.strip().splitlines()[-1] if f.traceback.strip() else ""
            because = " (it lost a peer)" if f.collateral else ""
            lines.append(f"  rank {f.rank}: {_how(f)}{because}" + (f": {last}" if last else ""))
    return "\n".join(lines)
