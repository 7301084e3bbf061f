"""Saying why a formed job failed: which peer is unreachable.

Every worker listens on a probe socket at its job address. When a collective fails because a peer or the
network went away, the worker's error ends with the peers whose probe does not answer (the same check
names them when Horovod's init does not finish connecting the workers; see `init_watchdog`).
"""

from __future__ import annotations

import socket
import sys
import threading
from typing import Any, Mapping

from hvdkeras.failures import lost_peer

_PROBE_TIMEOUT = 2.0


class Probe:
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

    def close(self) -> None:
        self.sock.close()


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


# (the hook that was there before ours, ours), while ours is installed.
_hooks: tuple[Any, Any] | None = None


def install_excepthook(peers: Mapping[int, Mapping[str, Any]], me: int) -> None:
    """Makes an uncaught error that shows a lost peer end with the peers that no longer answer."""
    global _hooks
    restore_excepthook()
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        text, seen = [], exc
        while seen is not None and len(text) < 8:
            text.append(f"{type(seen).__name__}: {seen}")
            seen = seen.__cause__ or seen.__context__
        if not lost_peer(" ".join(text)):
            return
        lost = unreachable_peers(peers, me)
        if lost:
            print(f"hvdkeras: rank {me} lost the job: unreachable: {'; '.join(lost)}.", file=sys.stderr, flush=True)
        else:
            print(f"hvdkeras: rank {me} lost the job; every peer's host still answers, so a worker process "
                  "failed or stopped (see its own output).", file=sys.stderr, flush=True)

    sys.excepthook = hook
    _hooks = (previous, hook)


def restore_excepthook() -> None:
    """Puts back the `sys.excepthook` that `install_excepthook` replaced (unless something replaced ours)."""
    global _hooks
    if _hooks is not None and sys.excepthook is _hooks[1]:
        sys.excepthook = _hooks[0]
    _hooks = None
