"""Each worker's signing relay for Horovod's own key-value requests, where the job has a secret.

Horovod's Gloo context sets and polls its keys (every worker's address) on the rendezvous with a plain HTTP
client written in C++, which cannot sign. With the job's secret, each worker therefore points Horovod at a relay
of its own on loopback (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT) for the time `hvd.init()` takes: the relay signs every
request with the secret (hvdkeras.job.auth) and forwards it to rank 0's rendezvous, which then answers signed
requests only, Horovod's keys included. The relay serves connections from this worker's own user only (on Linux,
read from the kernel's socket table), and passes Horovod's answers back unchanged.
"""

from __future__ import annotations

import http.client
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hvdkeras.job.auth import sign
from hvdkeras.job.rendezvous.registry import BODY_TIMEOUT, MAX_KV_BYTES
from hvdkeras.settings import received

LOOPBACK = "127.0.0.1"
TCP_TABLE = "/proc/self/net/tcp"  # this network namespace's TCP sockets, with their owners (Linux)
FORWARD_TIMEOUT = 10.0  # seconds for rank 0's answer to one forwarded request
_log = logging.getLogger("hvdkeras.rendezvous")


def peer_uid(peer: tuple[str, int], local_port: int, table: str = TCP_TABLE) -> int | None:
    """The user id owning the loopback socket `peer` that is connected to our `local_port`, from the kernel's
    table of this network namespace's TCP sockets; None where the table cannot be read or holds no such socket."""
    want_local, want_remote = f"{peer[1]:04X}", f"{local_port:04X}"
    try:
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[1].split(":")[1] == want_local and fields[2].split(":")[1] == want_remote:
                    return int(fields[7])
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return None


class _Handler(BaseHTTPRequestHandler):
    timeout = BODY_TIMEOUT

    def log_message(self, format, *args):  # noqa: A002 - http.server's name
        pass

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _own_user(self) -> bool:
        if not os.path.exists(TCP_TABLE):
            return True  # no kernel table to ask (not Linux): loopback alone bounds who reaches the relay
        owner = peer_uid(self.client_address, self.server.server_address[1])
        if owner == os.getuid():
            return True
        _log.warning("hvdkeras rendezvous relay: refused %s %s from %s: its socket belongs to user %s, this worker "
                     "runs as user %d", self.command, received(self.path, 60), self.client_address, owner,
                     os.getuid())
        self.close_connection = True
        self._answer(403)
        return False

    def _forward(self) -> None:
        self.close_connection = True
        if not self._own_user():
            return
        raw = self.headers.get("Content-Length", "0").strip()
        if not raw.isdigit() or int(raw) > MAX_KV_BYTES:
            self._answer(400 if not raw.isdigit() else 413)
            return
        body = self.rfile.read(int(raw)) if int(raw) else b""
        if len(body) < int(raw):
            self._answer(400)
            return
        relay = self.server
        headers = {"Content-Length": str(len(body)), **sign(relay.secret, self.command, self.path, body)}
        conn = http.client.HTTPConnection(relay.upstream[0], relay.upstream[1], timeout=FORWARD_TIMEOUT)
        try:
            conn.request(self.command, self.path, body=body if self.command == "PUT" else None, headers=headers)
            response = conn.getresponse()
            status, answer = response.status, response.read()
        except (OSError, http.client.HTTPException) as err:
            # Horovod's client retries a failed request; the worker's init watchdog bounds the whole.
            _log.debug("hvdkeras rendezvous relay: %s %s to %s:%d failed: %s", self.command, self.path,
                       *relay.upstream, err)
            status, answer = 502, b""
        finally:
            conn.close()
        self._answer(status, answer)

    do_GET = do_PUT = do_DELETE = _forward


class Relay:
    """A relay on loopback, in daemon threads, that signs with `secret` and forwards to `upstream` (ip, port)."""

    def __init__(self, upstream: tuple[str, int], secret: bytes):
        self.httpd = ThreadingHTTPServer((LOOPBACK, 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.upstream = upstream
        self.httpd.secret = secret
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="hvdkeras-relay", daemon=True)
        self.thread.start()

    def __repr__(self) -> str:  # never the secret
        return f"Relay({LOOPBACK}:{self.port} -> {self.httpd.upstream[0]}:{self.httpd.upstream[1]})"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


__all__ = ["LOOPBACK", "Relay", "TCP_TABLE", "peer_uid"]
