"""Forming one Horovod job from a launcher's environment, where horovodrun did not set it up.

Rank 0 hosts Horovod's own HTTP rendezvous (`registry`); every worker registers there and waits for the
whole table (`client`), each request signed with the job's secret where HVDKERAS_SECRET_FILE gives one
(`hvdkeras.job.auth`); with a secret, Horovod's own key-value requests go through a signing relay on each
worker's loopback (`relay`). From the table every worker computes the same local and cross ranks (whatever the
launcher's task layout), sets Horovod's variables and lets `hvd.init()` form the job. Once formed, a
failure that comes from a lost peer is explained by `diagnosis`. Every way this can fail raises its own
`RendezvousError` subclass (`errors`) within HVDKERAS_RENDEZVOUS_TIMEOUT seconds (default 60).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import threading
from typing import Mapping, MutableMapping

from hvdkeras import settings
from hvdkeras.job.auth import SecretError, Verifier, read_secret
from hvdkeras.job.launchers import LaunchEnv
from hvdkeras.job.rendezvous.client import interface_of, join, resolve, route_ip
from hvdkeras.job.rendezvous.diagnosis import Probe, install_excepthook, restore_excepthook, unreachable_peers
from hvdkeras.job.rendezvous.errors import (
    RendezvousAddressError,
    RendezvousAuthError,
    RendezvousBindError,
    RendezvousConflictError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousOtherJobError,
    RendezvousPortInUseError,
    RendezvousProtocolError,
    RendezvousSizeError,
    RendezvousTimeoutError,
)
from hvdkeras.job.rendezvous.registry import Registry, Server, assign, host_slots
from hvdkeras.job.rendezvous.relay import Relay

__all__ = [
    "Formed", "Probe", "Registry", "RendezvousAddressError", "RendezvousAuthError", "RendezvousBindError",
    "RendezvousConflictError", "RendezvousConnectionError", "RendezvousError", "RendezvousOtherJobError",
    "RendezvousPortInUseError", "RendezvousProtocolError", "RendezvousSizeError", "RendezvousTimeoutError",
    "Relay", "SecretError", "Server", "assign", "form", "host_slots", "init_watchdog", "join", "rendezvous_timeout",
    "resolve", "stop", "unreachable_peers",
]

def rendezvous_timeout(environ: Mapping[str, str]) -> float:
    """HVDKERAS_RENDEZVOUS_TIMEOUT, the bound on forming the job (default 60 s)."""
    return settings.read(environ).rendezvous_timeout


@dataclasses.dataclass
class Formed:
    """The job this process joined: what the launcher said (`env`), every rank's entry (`peers`), and this
    process's place in it, which Horovod is then started with."""

    env: LaunchEnv
    peers: dict[int, dict]
    server: Server | None
    probe: Probe | None = None
    relay: Relay | None = None
    local_rank: int = 0
    local_size: int = 1
    cross_rank: int = 0
    cross_size: int = 1


_active: Formed | None = None


def form(env: LaunchEnv, environ: MutableMapping[str, str] | None = None) -> Formed:
    """Joins the job that `env` describes and sets Horovod's variables in `environ` for `hvd.init()`.

    Raises:
        RendezvousError: the rendezvous cannot be hosted or reached, a peer never comes, another job holds
            the port, or the ranks disagree on the size; within HVDKERAS_RENDEZVOUS_TIMEOUT seconds.
    """
    global _active
    environ = os.environ if environ is None else environ
    given = settings.read(environ)
    timeout = given.rendezvous_timeout
    ip = resolve(env.rendezvous_addr, env.addr_source)
    my_ip = route_ip(ip, env.rendezvous_port)
    iface = given.iface or interface_of(my_ip)
    secret = read_secret(given.secret_file) if given.secret_file else None
    server, probe = None, None
    if env.rank == 0:
        server = Server(ip, env.rendezvous_port,
                        Registry(env.job_id, env.size, env.variables, verifier=secret and Verifier(secret)),
                        f"from {env.addr_source}")
    try:
        probe = Probe(my_ip)
        entry = {"job_id": env.job_id, "rank": env.rank, "size": env.size, "hostname": socket.gethostname(),
                 "host_key": my_ip, "ip": my_ip, "pid": os.getpid(), "probe_port": probe.port,
                 "variables": list(env.variables)}
        peers = join(env, ip, entry, timeout, secret)
    except BaseException:
        if server is not None:
            server.stop()
        if probe is not None:
            probe.close()
        raise
    mine = assign(peers)[env.rank]
    stall = given.stall_timeout
    # With a secret, Horovod's keys go through this worker's signing relay (rank 0 answers signed requests only).
    relay = Relay((ip, env.rendezvous_port), secret) if secret else None
    environ.update({
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": relay.httpd.server_address[0] if relay else ip,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(relay.port if relay else env.rendezvous_port),
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
    for name, value in settings.horovod_stall_environ(stall).items():
        environ.setdefault(name, value)
    install_excepthook(peers, env.rank)
    _active = Formed(env=env, peers=peers, server=server, probe=probe, relay=relay, local_rank=mine["local_rank"],
                     local_size=mine["local_size"], cross_rank=mine["cross_rank"], cross_size=mine["cross_size"])
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
    """Stops rank 0's rendezvous and this worker's probe, and restores `sys.excepthook` (at shutdown)."""
    global _active
    if _active is not None:
        if _active.server is not None:
            _active.server.stop()
        if _active.probe is not None:
            _active.probe.close()
        if _active.relay is not None:
            _active.relay.stop()
    restore_excepthook()
    _active = None
