"""A worker's side of forming a job: finding the rendezvous, registering, and waiting for the whole table.

A worker that cannot reach the rendezvous, or whose peers never come, fails after
HVDKERAS_RENDEZVOUS_TIMEOUT seconds (default 60) naming the address it tried and the ranks missing.
"""

from __future__ import annotations

import http.client
import json
import socket
import time

from hvdkeras.job.auth import sign
from hvdkeras.job.launchers import LaunchEnv
from hvdkeras.job.rendezvous.errors import (
    RendezvousAddressError,
    RendezvousAuthError,
    RendezvousConflictError,
    RendezvousConnectionError,
    RendezvousOtherJobError,
    RendezvousProtocolError,
    RendezvousTimeoutError,
)
from hvdkeras.job.rendezvous.registry import SCOPE

_REQUEST_TIMEOUT = 3.0


def resolve(addr: str, source: str) -> str:
    """The IPv4 address of a host name (or the address itself)."""
    try:
        infos = socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise RendezvousAddressError(
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
            raise RendezvousAddressError(f"No route from this host to the rendezvous at {ip}:{port}: {err}") from None
        return sock.getsockname()[0]


def interface_of(ip: str) -> str:
    """The name of the network interface that holds `ip`."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addresses):
            return name
    raise RendezvousAddressError(f"No network interface of this host holds {ip}; set HVDKERAS_IFACE to the interface "
                          "that reaches rank 0.")


def _request(ip: str, port: int, method: str, path: str, payload: dict | None = None,
             secret: bytes | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(ip, port, timeout=_REQUEST_TIMEOUT)
    try:
        body = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Length": str(len(body or b""))}
        if secret is not None:
            headers.update(sign(secret, method, path, body or b""))
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, (json.loads(data) if data else {})
    finally:
        conn.close()


def join(env: LaunchEnv, ip: str, entry: dict, timeout: float, secret: bytes | None = None) -> dict[int, dict]:
    """Registers this worker and waits for the complete table (each request signed with `secret`, the job's,
    where there is one); raises RendezvousError on every failure."""
    where = f"{env.rendezvous_addr}:{env.rendezvous_port}" + (f" ({ip})" if ip != env.rendezvous_addr else "")
    deadline = time.monotonic() + timeout
    last_error = None
    registered = False
    table: dict = {}
    while time.monotonic() < deadline:
        try:
            if not registered:
                status, reply = _request(ip, env.rendezvous_port, "PUT", f"/{SCOPE}/register", entry, secret)
                if status == 401:
                    raise RendezvousAuthError(
                        f"The rendezvous at {where} refused this worker's registration: {reply.get('message')}. "
                        "Every process of the job must read the same secret (HVDKERAS_SECRET_FILE), and the "
                        "hosts' clocks must agree within a minute.")
                if status == 403 and reply.get("error") == "other-job":
                    raise RendezvousOtherJobError(
                        f"The rendezvous at {where} belongs to another job (job id {reply.get('job_id')!r}); this "
                        f"worker is of job {env.job_id!r}. Another job holds this port: give each job its own "
                        "MASTER_PORT (or HVDKERAS_RENDEZVOUS_PORT).")
                if status == 409:
                    raise RendezvousConflictError(f"Cannot join the job at the rendezvous {where}: "
                                                  f"{reply.get('message')}. Read from {env.describe()}.")
                if status != 200:
                    raise RendezvousProtocolError(f"The server at {where} is not a hvdkeras rendezvous (HTTP {status} "
                                          "to a registration).")
                registered = True
            status, table = _request(ip, env.rendezvous_port, "GET", f"/{SCOPE}/table", secret=secret)
            if table.get("conflict"):
                raise RendezvousConflictError(f"Cannot form the job: {table['conflict']}. Every process must be told "
                                      "the same size.")
            if len(table.get("entries", {})) == env.size:
                return {int(r): e for r, e in table["entries"].items()}
        except (OSError, http.client.HTTPException, ValueError) as err:
            last_error = err
        time.sleep(0.1 if registered else 0.25)
    if not registered:
        raise RendezvousConnectionError(
            f"Rank {env.rank} could not reach the job's rendezvous at {where} within {timeout:g} s "
            f"(last error: {last_error}). Rank 0 hosts it: check that rank 0 started, that "
            f"{env.addr_source} names rank 0's host and that port {env.rendezvous_port} is open between the hosts. "
            f"Read from {env.describe()}. HVDKERAS_RENDEZVOUS_TIMEOUT sets this bound.")
    joined = {int(r): e for r, e in table.get("entries", {}).items()}
    missing = [r for r in range(env.size) if r not in joined]
    present = ", ".join(f"rank {r} on {e.get('hostname')} ({e.get('ip')})" for r, e in sorted(joined.items()))
    raise RendezvousTimeoutError(
        f"Ranks {missing} of {env.size} never joined the job at the rendezvous {where} within {timeout:g} s "
        f"(joined: {present or 'none'}). Check that {env.launcher} started all {env.size} processes and that they "
        f"reach {where}. Read from {env.describe()}. HVDKERAS_RENDEZVOUS_TIMEOUT sets this bound.")
