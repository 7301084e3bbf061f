"""Rank 0's side of forming a job: the registry of this job's workers and the HTTP server that holds it.

The server is Horovod's own RendezvousHTTPServer, bound to the address the workers use (never every
interface), for as long as rank 0's process runs. Before Horovod starts, every worker registers with its
job id, rank, size and host; the registry admits only workers of this job, refuses a second claim on a
rank and a size that differs from rank 0's, and answers Horovod's own requests only from the hosts of
admitted workers, once all ranks are in. With the job's secret (hvdkeras.job.auth) every endpoint answers signed
requests only: the registration, the table, and Horovod's own key-value requests, which each worker's relay
(`relay`) signs for Gloo's C++ store.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import threading
from typing import Any, Mapping

from hvdkeras import _collectives as C
from hvdkeras.job.auth import Verifier
from hvdkeras.job.rendezvous.errors import RendezvousBindError, RendezvousPortInUseError
from hvdkeras.settings import received

SCOPE = "hvdkeras"
# A registration is a few hundred bytes; Horovod's own keys (Gloo's addresses) a few hundred more.
MAX_REGISTRATION_BYTES = 64 << 10
MAX_KV_BYTES = 1 << 20
BODY_TIMEOUT = 10.0  # seconds a client may take to send the body it announced
_log = logging.getLogger("hvdkeras.rendezvous")

# Each field of a registration, and what it must be.
ENTRY_FIELDS = {"job_id": (str, "a string"), "rank": (int, "an integer >= 0, below size"),
                "size": (int, "an integer >= 1"), "hostname": (str, "a string"), "host_key": (str, "a string"),
                "ip": (str, "a string"), "pid": (int, "an integer >= 0"),
                "probe_port": (int, "an integer from 0 to 65535"), "variables": (list, "a list of strings")}


class BadRequest(ValueError):
    """A request the rendezvous refuses: its HTTP status and a message that says what was received and what is
    expected."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_entry(entry: Any) -> dict:
    """`entry` as a registration, or BadRequest naming the first field that is missing or of the wrong type."""
    if not isinstance(entry, dict):
        raise BadRequest(400, f"a registration must be a JSON object with the fields {', '.join(ENTRY_FIELDS)}; "
                              f"received a JSON {type(entry).__name__}: {received(entry)}")
    for name, (kind, what) in ENTRY_FIELDS.items():
        if name not in entry:
            raise BadRequest(400, f"a registration needs the field `{name}` ({what}); received the fields "
                                  f"{received(sorted(entry))}")
        value = entry[name]
        wrong = not isinstance(value, kind) or isinstance(value, bool)
        if not wrong and kind is int:
            wrong = value < (1 if name == "size" else 0) or (name == "probe_port" and value > 65535)
        if not wrong and kind is list:
            wrong = not all(isinstance(item, str) for item in value)
        if wrong:
            raise BadRequest(400, f"`{name}` must be {what}; received {received(value)}")
    if entry["rank"] >= entry["size"]:
        raise BadRequest(400, f"`rank` must be below `size`; received rank {entry['rank']} and size {entry['size']}")
    return entry


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

    def __init__(self, job_id: str, size: int, variables: tuple[str, ...], on_complete=None,
                 verifier: Verifier | None = None):
        self.job_id = job_id
        self.verifier = verifier  # with the job's secret: every request to our endpoints is signed
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

        def _peer(self) -> str:
            return f"{self.client_address[0]}:{self.client_address[1]}"

        def _refuse(self, status: int, message: str) -> None:
            """Answers a bad request with what was wrong, logs it with the peer's address, and closes the
            connection (an unread body must not be taken for the next request). The server carries on."""
            _log.warning("hvdkeras rendezvous: refused %s %s from %s (HTTP %d): %s", self.command,
                         received(self.path, 60), self._peer(), status, message)
            self.close_connection = True
            self._reply(status, {"error": "bad-request", "message": message})

        def _unsigned(self, body: bytes = b"") -> bool:
            """With the job's secret: refuses (401, logged with the peer's address) a request whose signature is
            missing, wrong, out of its time window or replayed."""
            verifier = self.server.registry.verifier
            if verifier is None:
                return False
            why = verifier.refusal(self.command, self.path, self.headers, body)
            if why is None:
                return False
            self._refuse(401, f"not authenticated: {why}")
            return True

        def _refused(self) -> bool:
            if self.server.registry.admits(self.client_address[0]):
                return False
            _log.warning("hvdkeras rendezvous: refused %s %s from %s (HTTP 403): not a host of this job's "
                         "registered workers, or the job is not complete", self.command, received(self.path, 60),
                         self._peer())
            self.close_connection = True
            self.send_status_code(403)
            return True

        def _length(self, limit: int) -> int:
            """The body's length from Content-Length, checked before a byte of the body is read."""
            raw = self.headers.get("Content-Length")
            if raw is None:
                raise BadRequest(411, "a PUT needs a Content-Length header; received none")
            if not raw.strip().isdigit():
                raise BadRequest(400, f"Content-Length must be a number of bytes; received {received(raw)}")
            if int(raw) > limit:
                raise BadRequest(413, f"a body of at most {limit} bytes is expected here; received Content-Length "
                                      f"{int(raw)}")
            return int(raw)

        def _body(self, limit: int) -> bytes:
            length = self._length(limit)
            self.connection.settimeout(BODY_TIMEOUT)
            data = b""
            try:
                while len(data) < length:
                    chunk = self.rfile.read1(length - len(data))
                    if not chunk:
                        break
                    data += chunk
            except OSError:  # a timeout included
                pass
            if len(data) < length:
                raise BadRequest(400, f"the body was cut short: Content-Length {length} announced, {len(data)} bytes "
                                      f"received within {BODY_TIMEOUT:g} s")
            return data

        def do_PUT(self):
            scope, key = self._split()
            try:
                if scope == SCOPE and key == "register":
                    data = self._body(MAX_REGISTRATION_BYTES)
                    if self._unsigned(data):
                        return
                    try:
                        entry = json.loads(data)
                    except ValueError as err:
                        raise BadRequest(400, f"a registration must be JSON ({err}); received "
                                              f"{received(data)}") from None
                    status, payload = self.server.registry.register(check_entry(entry), self.client_address[0])
                    self._reply(status, payload)
                elif self.server.registry.verifier is None:
                    if not self._refused():
                        self._length(MAX_KV_BYTES)  # Horovod's own handler reads the body
                        super().do_PUT()
                else:
                    data = self._body(MAX_KV_BYTES)
                    if not self._unsigned(data) and not self._refused():
                        self.rfile = io.BytesIO(data)  # what Horovod's own handler reads, checked
                        self.close_connection = True
                        super().do_PUT()
            except BadRequest as err:
                self._refuse(err.status, str(err))

        def do_GET(self):
            scope, key = self._split()
            if scope == SCOPE and key == "table":
                if not self._unsigned():
                    self._reply(200, self.server.registry.table())
            elif not self._unsigned() and not self._refused():
                super().do_GET()

        def do_DELETE(self):
            if not self._unsigned() and not self._refused():
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
