"""The job's shared secret and the signatures of rendezvous requests (docs/security.md).

With a secret (HVDKERAS_SECRET_FILE names a file holding it), every request a worker sends to hvdkeras's
rendezvous carries an HMAC-SHA256 over its method, path, body, a time and a nonce; rank 0's server refuses a
request whose MAC is missing or wrong, whose time is outside the window, or whose nonce it has seen (a replay),
and logs the refusal with the peer's address. The secret itself is read from the file only: it never travels,
and never appears on a command line, in the environment or in a log.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import threading
import time
from collections import OrderedDict
from typing import Callable, Mapping

MAC_HEADER = "X-Hvdkeras-Mac"
TIME_HEADER = "X-Hvdkeras-Time"
NONCE_HEADER = "X-Hvdkeras-Nonce"
MIN_SECRET_BYTES = 32
WINDOW_SECONDS = 60.0  # a request's time may differ from the server's clock by this much (either way)


class SecretError(ValueError):
    """The secret file cannot serve: missing, unreadable, too short, or open to other users."""


def read_secret(path: str) -> bytes:
    """The secret held in the file at `path` (surrounding whitespace stripped).

    Raises:
        SecretError: the file cannot be read, holds fewer than MIN_SECRET_BYTES bytes, or other users may read
            or write it; naming the file and what was found (never its content).
    """
    try:
        info = os.stat(path)
        with open(path, "rb") as f:
            secret = f.read().strip()
    except OSError as err:
        raise SecretError(f"HVDKERAS_SECRET_FILE must name a readable file holding the job's secret. Received: "
                          f"HVDKERAS_SECRET_FILE={path!r} ({err.strerror})") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretError(f"The secret file must be readable by its owner only (chmod 600): others may read or "
                          f"write it now. Received: HVDKERAS_SECRET_FILE={path!r} with mode "
                          f"{stat.S_IMODE(info.st_mode):o}")
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(f"The secret file must hold at least {MIN_SECRET_BYTES} bytes (such as `openssl rand "
                          f"-hex 32`). Received: HVDKERAS_SECRET_FILE={path!r} holding {len(secret)} bytes")
    return secret


def write_secret(folder: str) -> str:
    """A new random secret (32 bytes, hex) in a file of its own in `folder`, readable by its owner only; returns
    the file's path (what HVDKERAS_SECRET_FILE is set to)."""
    path = os.path.join(folder, "hvdkeras-secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def _mac(secret: bytes, method: str, path: str, body: bytes, when: str, nonce: str) -> str:
    message = "\n".join([method, path, when, nonce, hashlib.sha256(body).hexdigest()]).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(secret: bytes, method: str, path: str, body: bytes = b"", now: float | None = None) -> dict[str, str]:
    """The headers that authenticate one request: its time, a fresh nonce and the MAC over both and the request."""
    when = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(16)
    return {TIME_HEADER: when, NONCE_HEADER: nonce, MAC_HEADER: _mac(secret, method, path, body, when, nonce)}


class Verifier:
    """Rank 0's check of signed requests: the MAC, the time window and each nonce once."""

    def __init__(self, secret: bytes, window: float = WINDOW_SECONDS, clock: Callable[[], float] = time.time):
        self._secret = secret
        self.window = window
        self._clock = clock
        # Nonces in the order they came (Gloo polls its keys every 10 ms through each worker's relay, so this is
        # pruned from the oldest end, never scanned whole).
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the secret
        return f"Verifier(window={self.window:g})"

    def refusal(self, method: str, path: str, headers: Mapping[str, str], body: bytes = b"") -> str | None:
        """Why the request is refused, or None when it is authentic, in its window and new."""
        mac, when, nonce = headers.get(MAC_HEADER), headers.get(TIME_HEADER), headers.get(NONCE_HEADER)
        if not mac or not when or not nonce:
            return "it carries no signature (the job has a secret: HVDKERAS_SECRET_FILE)"
        if not hmac.compare_digest(mac, _mac(self._secret, method, path, body, when, nonce)):
            return "its signature is wrong (not signed with this job's secret, or altered)"
        try:
            sent = float(when)
        except ValueError:
            return "its time is not a number"
        now = self._clock()
        if abs(now - sent) > self.window:
            return f"its time is {now - sent:+.0f} s from the server's, outside the {self.window:g} s window"
        with self._lock:
            while self._seen and now - next(iter(self._seen.values())) > 2 * self.window:
                self._seen.popitem(last=False)
            if nonce in self._seen:
                return "it was seen before (a replayed request)"
            self._seen[nonce] = now
        return None
