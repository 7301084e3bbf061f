"""What a worker's error says when it failed because a peer went away or the network did.

The one list of those markers: the supervisor (which rank failed first), the lost-job diagnosis (whether to
probe the peers) and elastic training (whether to restore and go on) all read a failure with it. Plain
Python, so `hvdkeras run` reads it without TensorFlow.
"""

from __future__ import annotations

LOST_PEER_MARKERS = (
    "Horovod has been shut down", "HorovodInternalError", "Gloo", "gloo", "Connection reset", "Connection closed",
    "Connection refused", "No route to host", "Timed out", "timed out",
)
_LOST_PEER_BYTES = tuple(marker.encode() for marker in LOST_PEER_MARKERS)


def lost_peer(text: str | bytes) -> bool:
    """Whether `text` (an error message, or a line of a worker's output) shows a lost peer."""
    markers = _LOST_PEER_BYTES if isinstance(text, bytes) else LOST_PEER_MARKERS
    return any(marker in text for marker in markers)
