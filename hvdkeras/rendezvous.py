"""Forming one Horovod job from a launcher's environment, where horovodrun did not set it up.

Rank 0 hosts Horovod's own HTTP rendezvous, bound to the address the workers use (never every
interface), for as long as its process runs. Before Horovod starts, every worker registers there with its
job id, rank, size and host; the registry admits only workers of this job, refuses a second claim on a
rank and a size that differs from rank 0's, and answers Horovod's own requests only from the hosts of
admitted workers. Once all ranks are in, every worker computes the same local and cross ranks from the
table (whatever the launcher's task layout), sets Horovod's variables and lets `hvd.init()` form the job.

A worker that cannot reach the rendezvous, or whose peers never come, fails after
HVDKERAS_RENDEZVOUS_TIMEOUT seconds (default 60) naming the address it tried and the ranks missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Mapping, MutableMapping

from hvdkeras import _collectives as C
from hvdkeras.launching import DEFAULT_STALL_TIMEOUT, LaunchEnv, env_seconds

DEFAULT_TIMEOUT = 60.0
SCOPE = "hvdkeras"
_REQUEST_TIMEOUT = 3.0
_PROBE_TIMEOUT = 2.0
# What a worker's error says when a collective failed because a peer went away or the network did.
_LOST_PEER_MARKERS = ("Horovod has been shut down", "Gloo", "gloo", "Connection reset", "Connection closed",
                      "Timed out", "timed out", "HorovodInternalError", "Connection refused", "No route to host")


class RendezvousError(RuntimeError):
    """The job could not be formed; the message names the address, the ranks and what to check."""


def rendezvous_timeout(environ: Mapping[str, str]) -> float:
    """HVDKERAS_RENDEZVOUS_TIMEOUT, the bound on forming the job (default 60 s)."""
    return env_seconds(environ, "HVDKERAS_RENDEZVOUS_TIMEOUT", DEFAULT_TIMEOUT)


# ------------------------------------------------------------------------------------------ addresses
def resolve(addr: str, source: str) -> str:
    """The IPv4 address of a host name (or the address itself)."""
    try:
        infos = socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise RendezvousError(
            f"The rendezvous host does not resolve: {source} gave {addr!r} ({err.strerror}). Set MASTER_ADDR "
            "(or HVDKERAS_RENDEZVOUS_ADDR) to rank 0's host name or IP address, the same in every process."
        ) from None
    return infos[0][4][0]


def route_ip(ip: str, port: int) -> str:
    """This host's address on the route to ip:port (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((ip, port))
        except OSError as err:
            raise RendezvousError(f"No route from this host to the rendezvous at {ip}:{port}: {err}") from None
        return sock.getsockname()[0]


def interface_of(ip: str) -> str:
    """The name of the network interface that holds `ip`."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addresses):
            return name
    raise RendezvousError(f"No network interface of this host holds {ip}; set HVDKERAS_IFACE to the interface "
                          "that reaches rank 0.")


# ------------------------------------------------------------------------------------------- registry
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
            raise RendezvousError(
                f"Rank 0 cannot host the job's rendezvous on {ip}:{port} ({source}): {err.strerror}. "
                + ("Another job (or another program) holds this port: give this job its own MASTER_PORT "
                   "(or HVDKERAS_RENDEZVOUS_PORT)." if err.errno == 98 else
                   "Is this address one of rank 0's own? Rank 0 must run on the host that MASTER_ADDR names.")
            ) from None
        registry.on_complete = lambda entries: self.httpd.init(self._host_plan(host_slots(entries), len(entries)))
        self.httpd.registry = registry
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="hvdkeras-rendezvous", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------------------------- client
def _request(ip: str, port: int, method: str, path: str, payload: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(ip, port, timeout=_REQUEST_TIMEOUT)
    try:
        body = None if payload is None else json.dumps(payload).encode()
        conn.request(method, path, body=body, headers={"Content-Length": str(len(body or b""))})
        response = conn.getresponse()
        data = response.read()
        return response.status, (json.loads(data) if data else {})
    finally:
        conn.close()


def _join(env: LaunchEnv, ip: str, entry: dict, timeout: float) -> dict[int, dict]:
    """Registers this worker and waits for the complete table; raises RendezvousError on every failure."""
    where = f"{env.rendezvous_addr}:{env.rendezvous_port}" + (f" ({ip})" if ip != env.rendezvous_addr else "")
    deadline = time.monotonic() + timeout
    last_error = None
    registered = False
    table: dict = {}
    while time.monotonic() < deadline:
        try:
            if not registered:
                status, reply = _request(ip, env.rendezvous_port, "PUT", f"/{SCOPE}/register", entry)
                if status == 403 and reply.get("error") == "other-job":
                    raise RendezvousError(
                        f"The rendezvous at {where} belongs to another job (job id {reply.get('job_id')!r}); this "
                        f"worker is of job {env.job_id!r}. Another job holds this port: give each job its own "
                        "MASTER_PORT (or HVDKERAS_RENDEZVOUS_PORT).")
                if status == 409:
                    raise RendezvousError(f"Cannot join the job at the rendezvous {where}: {reply.get('message')}. "
                                          f"Read from {env.describe()}.")
                if status != 200:
                    raise RendezvousError(f"The server at {where} is not a hvdkeras rendezvous (HTTP {status} "
                                          "to a registration).")
                registered = True
            status, table = _request(ip, env.rendezvous_port, "GET", f"/{SCOPE}/table")
            if table.get("conflict"):
                raise RendezvousError(f"Cannot form the job: {table['conflict']}. Every process must be told "
                                      "the same size.")
            if len(table.get("entries", {})) == env.size:
                return {int(r): e for r, e in table["entries"].items()}
        except (OSError, http.client.HTTPException, ValueError) as err:
            last_error = err
        time.sleep(0.1 if registered else 0.25)
    if not registered:
        raise RendezvousError(
            f"Rank {env.rank} could not reach the job's rendezvous at {where} within {timeout:g} s "
            f"(last error: {last_error}). Rank 0 hosts it: check that rank 0 started, that "
            f"{env.addr_source} names rank 0's host and that port {env.rendezvous_port} is open between the hosts. "
            f"Read from {env.describe()}. HVDKERAS_RENDEZVOUS_TIMEOUT sets this bound.")
    joined = {int(r): e for r, e in table.get("entries", {}).items()}
    missing = [r for r in range(env.size) if r not in joined]
    present = ", ".join(f"rank {r} on {e.get('hostname')} ({e.get('ip')})" for r, e in sorted(joined.items()))
    raise RendezvousError(
        f"Ranks {missing} of {env.size} never joined the job at the rendezvous {where} within {timeout:g} s "
        f"(joined: {present or 'none'}). Check that {env.launcher} started all {env.size} processes and that they "
        f"reach {where}. Read from {env.describe()}. HVDKERAS_RENDEZVOUS_TIMEOUT sets this bound.")


# ---------------------------------------------------------------------------------- failure diagnosis
class _Probe:
    """A listening socket on this worker's job address: peers connect to it to tell whether we are reachable."""

    def __init__(self, ip: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((ip, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, name="hvdkeras-probe", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()


def unreachable_peers(peers: Mapping[int, Mapping[str, Any]], me: int, timeout: float = _PROBE_TIMEOUT) -> list[str]:
    """The peers whose probe socket does not answer within `timeout`, described for a message."""
    results: dict[int, bool] = {}

    def probe(rank: int, peer: Mapping[str, Any]) -> None:
        try:
            socket.create_connection((peer["ip"], peer["probe_port"]), timeout=timeout).close()
            results[rank] = True
        except OSError:
            results[rank] = False

    threads = [threading.Thread(target=probe, args=(r, p), daemon=True) for r, p in peers.items() if r != me][:256]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1)
    return [f"rank {r} on {peers[r]['hostname']} ({peers[r]['ip']})" for r in sorted(peers)
            if r != me and not results.get(r, False)]


def _install_excepthook(peers: Mapping[int, Mapping[str, Any]], me: int) -> None:
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        text, seen = [], exc
        while seen is not None and len(text) < 8:
            text.append(f"{type(seen).__name__}: {seen}")
            seen = seen.__cause__ or seen.__context__
        if not any(marker in " ".join(text) for marker in _LOST_PEER_MARKERS):
            return
        lost = unreachable_peers(peers, me)
        if lost:
            print(f"hvdkeras: rank {me} lost the job: unreachable: {'; '.join(lost)}.", file=sys.stderr, flush=True)
        else:
            print(f"hvdkeras: rank {me} lost the job; every peer's host still answers, so a worker process "
                  "failed or stopped (see its own output).", file=sys.stderr, flush=True)

    sys.excepthook = hook


# ---------------------------------------------------------------------------------------------- form
@dataclasses.dataclass
class Formed:
    env: LaunchEnv
    peers: dict[int, dict]
    server: Server | None


_active: Formed | None = None


def form(env: LaunchEnv, environ: MutableMapping[str, str] | None = None) -> Formed:
    """Joins the job that `env` describes and sets Horovod's variables in `environ` for `hvd.init()`.

    Raises:
        RendezvousError: the rendezvous cannot be hosted or reached, a peer never comes, another job holds
            the port, or the ranks disagree on the size; within HVDKERAS_RENDEZVOUS_TIMEOUT seconds.
    """
    global _active
    environ = os.environ if environ is None else environ
    timeout = rendezvous_timeout(environ)
    ip = resolve(env.rendezvous_addr, env.addr_source)
    my_ip = route_ip(ip, env.rendezvous_port)
    iface = environ.get("HVDKERAS_IFACE", "").strip() or interface_of(my_ip)
    server = None
    if env.rank == 0:
        server = Server(ip, env.rendezvous_port, Registry(env.job_id, env.size, env.variables),
                        f"from {env.addr_source}")
    try:
        probe = _Probe(my_ip)
        entry = {"job_id": env.job_id, "rank": env.rank, "size": env.size, "hostname": socket.gethostname(),
                 "host_key": my_ip, "ip": my_ip, "pid": os.getpid(), "probe_port": probe.port,
                 "variables": list(env.variables)}
        peers = _join(env, ip, entry, timeout)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    mine = assign(peers)[env.rank]
    stall = env_seconds(environ, "HVDKERAS_STALL_TIMEOUT", DEFAULT_STALL_TIMEOUT)
    environ.update({
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": ip,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(env.rendezvous_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
        "HOROVOD_HOSTNAME": str(mine["host_key"]),
        "HOROVOD_RANK": str(env.rank),
        "HOROVOD_SIZE": str(env.size),
        "HOROVOD_LOCAL_RANK": str(mine["local_rank"]),
        "HOROVOD_LOCAL_SIZE": str(mine["local_size"]),
        "HOROVOD_CROSS_RANK": str(mine["cross_rank"]),
        "HOROVOD_CROSS_SIZE": str(mine["cross_size"]),
    })
    environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", f"{stall:g}")
    _install_excepthook(peers, env.rank)
    _active = Formed(env=env, peers=peers, server=server)
    return _active


@contextlib.contextmanager
def init_watchdog(formed: Formed, environ: Mapping[str, str] | None = None):
    """Bounds Horovod's own init of a job we formed: past the bound the process exits with a clear message.

    Horovod's init blocks in C++ (Gloo connecting every pair of workers) and cannot be interrupted; when a
    peer dies in the middle of it, the others would wait forever.
    """
    environ = os.environ if environ is None else environ
    bound = rendezvous_timeout(environ)
    me = formed.env.rank

    def expire() -> None:
        lost = unreachable_peers(formed.peers, me)
        detail = f"unreachable: {'; '.join(lost)}" if lost else "every peer's host answers, so a peer failed " \
                                                                "while connecting (see its output)"
        print(f"hvdkeras: rank {me}: Horovod did not finish connecting the {formed.env.size} workers within "
              f"{bound:g} s after all of them registered ({detail}; Gloo interface "
              f"{environ.get('HOROVOD_GLOO_IFACE')}). Exiting instead of hanging; HVDKERAS_RENDEZVOUS_TIMEOUT sets "
              "this bound.", file=sys.stderr, flush=True)
        os._exit(1)

    timer = threading.Timer(bound, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def stop() -> None:
    """Stops rank 0's rendezvous (at shutdown)."""
    global _active
    if _active is not None and _active.server is not None:
        _active.server.stop()
    _active = None
