"""Rank 0's side of forming a job: the registry of this job's workers and the HTTP server that holds it.

The server is Horovod's own RendezvousHTTPServer, bound to the address the workers use (never every
interface), for as long as rank 0's process runs. Before Horovod starts, every worker registers with its
job id, rank, size and host; the registry admits only workers of this job, refuses a second claim on a
rank and a size that differs from rank 0's, and answers Horovod's own requests only from the hosts of
admitted workers, once all ranks are in.
"""

from __future__ import annotations

import errno
import json
import threading
from typing import Any, Mapping

from hvdkeras import _collectives as C
from hvdkeras.job.rendezvous.errors import RendezvousBindError, RendezvousPortInUseError

SCOPE = "hvdkeras"


def assign(entries: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, int | str]]:
    """Horovod's local and cross ranks for every rank, from the host each registered from.

    Processes on a host get local ranks in rank order; cross rank l on a host is the number of earlier
    hosts (by their lowest rank) with more than l processes. Correct for block, cyclic or any other layout.
    """
    hosts: dict[str, list[int]] = {}
    for rank in sorted(entries):
        hosts.setdefault(str(entries[rank]["host_key"]), []).append(rank)
    order = list(hosts)
    out: dict[int, dict[str, int | str]] = {}
    for key in order:
        for local_rank, rank in enumerate(hosts[key]):
            cross = [k for k in order if len(hosts[k]) > local_rank]
            out[rank] = {"host_key": key, "local_rank": local_rank, "local_size": len(hosts[key]),
                         "cross_rank": cross.index(key), "cross_size": len(cross)}
    return out


def host_slots(entries: Mapping[int, Mapping[str, Any]]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for rank in sorted(entries):
        key = str(entries[rank]["host_key"])
        counts[key] = counts.get(key, 0) + 1
    return list(counts.items())


class Registry:
    """Rank 0's record of the workers of its job (the server side of the handshake)."""

    def __init__(self, job_id: str, size: int, variables: tuple[str, ...], on_complete=None):
        self.job_id = job_id
        self.size = size
        self.variables = variables
        self.entries: dict[int, dict] = {}
        self.conflict: str | None = None
        self.admitted: set[str] = set()
        self.on_complete = on_complete
        self._lock = threading.Lock()

    def register(self, entry: Mapping[str, Any], client_ip: str) -> tuple[int, dict]:
        with self._lock:
            if entry.get("job_id") != self.job_id:
                return 403, {"error": "other-job", "job_id": self.job_id}
            rank, size = int(entry["rank"]), int(entry["size"])
            if size != self.size:
                self.conflict = self.conflict or (
                    f"the ranks disagree on the job's size: rank 0 says {self.size} ({', '.join(self.variables)}) "
                    f"and rank {rank} on {entry.get('hostname')} says {size} ({', '.join(entry.get('variables', []))})"
                )
                return 409, {"error": "size", "message": self.conflict}
            held = self.entries.get(rank)
            if held is not None and (held["pid"], held["host_key"]) != (entry["pid"], entry["host_key"]):
                message = (f"rank {rank} is already in the job at this rendezvous (pid {held['pid']} on "
                           f"{held['hostname']}); this process (pid {entry['pid']} on {entry.get('hostname')}) "
                           "claims the same rank")
                if len(self.entries) < self.size:
                    self.conflict = self.conflict or message
                return 409, {"error": "duplicate", "message": message}
            self.entries[rank] = dict(entry)
            self.admitted.add(client_ip)
            if len(self.entries) == self.size and self.on_complete is not None:
                # Before any worker can see a complete table, so before any of Horovod's own requests.
                self.on_complete(self.entries)
            return 200, {"ok": True}

    def table(self) -> dict:
        with self._lock:
            return {"size": self.size, "entries": {str(r): e for r, e in self.entries.items()},
                    "conflict": self.conflict}

    def admits(self, client_ip: str) -> bool:
        with self._lock:
            return len(self.entries) == self.size and client_ip in self.admitted


def _handler_class(base):
    class Handler(base):
        """Horovod's RendezvousHandler, plus the handshake and admission of this job's workers only."""

        def _split(self):
            parts = self.path.split("/")
            return (parts[1], parts[2]) if len(parts) == 3 else (None, None)

        def _reply(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _refused(self) -> bool:
            if self.server.registry.admits(self.client_address[0]):
                return False
            self.send_status_code(403)
            return True

        def do_PUT(self):
            scope, key = self._split()
            if scope == SCOPE and key == "register":
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    entry = json.loads(self.rfile.read(length))
                    status, payload = self.server.registry.register(entry, self.client_address[0])
                except (ValueError, KeyError, TypeError) as err:
                    status, payload = 400, {"error": "bad-request", "message": str(err)}
                self._reply(status, payload)
            elif not self._refused():
                super().do_PUT()

        def do_GET(self):
            scope, key = self._split()
            if scope == SCOPE and key == "table":
                self._reply(200, self.server.registry.table())
            elif not self._refused():
                super().do_GET()

        def do_DELETE(self):
            if not self._refused():
                super().do_DELETE()

    return Handler


class Server:
    """Horovod's RendezvousHTTPServer on ip:port in a daemon thread, with this job's registry."""

    def __init__(self, ip: str, port: int, registry: Registry, source: str):
        server_cls, handler_cls, self._host_plan = C.rendezvous_parts()
        try:
            self.httpd = server_cls((ip, port), _handler_class(handler_cls), False)
        except OSError as err:
            where = f"Rank 0 cannot host the job's rendezvous on {ip}:{port} ({source}): {err.strerror}. "
            if err.errno == errno.EADDRINUSE:
                raise RendezvousPortInUseError(
                    where + "Another job (or another program) holds this port: give this job its own MASTER_PORT "
                    "(or HVDKERAS_RENDEZVOUS_PORT).") from None
            raise RendezvousBindError(
                where + "Is this address one of rank 0's own? Rank 0 must run on the host that MASTER_ADDR names."
            ) from None
        registry.on_complete = lambda entries: self.httpd.init(self._host_plan(host_slots(entries), len(entries)))
        self.httpd.registry = registry
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="hvdkeras-rendezvous", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
