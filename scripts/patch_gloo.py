"""Makes Gloo's alltoallv and allgatherv post their receives before their sends (Horovod 0.28.1's vendored Gloo).

    patch_gloo.py GLOO_SOURCE_DIR        (third_party/gloo/gloo of a Horovod source tree; edits it in place)

Why: over Gloo's TCP transport a send goes out only once the peer has said it is ready to receive, and then
writes its whole payload at once. In alltoallv and allgatherv each rank posts its send first. The rank that
arrives second finds the peer ready, writes all its data, and only then posts its own receive, whose notice
waits behind that data on the same socket; the first rank cannot start sending until it arrives. So the two
workers take turns on the link instead of sending both ways at once, and an alltoall or allgather of two
workers takes twice its wire time (the two test hosts at 200 Mbit/s, docs/sharding.md). Gloo's allreduce
posts each receive first and runs at the link's rate both ways; this makes the other two do the same.

Exits non-zero, naming the file, when the source is not the one this was written against.
"""

from __future__ import annotations

import sys
from pathlib import Path

from source_patch import SourceChanged

ALLTOALLV_HEAD = ("  for (int i = 1; i < worldSize; i++) {\n"
                  "    int sendRank = (myRank + i) % worldSize;\n"
                  "    int recvRank = (myRank + worldSize - i) % worldSize;\n")
ALLTOALLV_SEND = "    in->send(\n        sendRank, slot, inOffsetPerRank[sendRank], inLengthPerRank[sendRank]);\n"
ALLTOALLV_RECV = "    out->recv(\n        recvRank, slot, outOffsetPerRank[recvRank], outLengthPerRank[recvRank]);\n"


def alltoallv(text: str) -> str:
    """One loop posting every receive, then one posting every send (was: a send, then a receive, per peer)."""
    old = ALLTOALLV_HEAD + ALLTOALLV_SEND + ALLTOALLV_RECV + "  }\n"
    if text.count(old) != 1:
        raise SourceChanged(f"alltoallv.cc: expected the remote-copy loop once, found it {text.count(old)} times")
    return text.replace(old, ALLTOALLV_HEAD + ALLTOALLV_RECV + "  }\n" + ALLTOALLV_HEAD + ALLTOALLV_SEND + "  }\n")


def allgatherv(text: str) -> str:
    """In each step of the ring, the receive posted before the send (two places: the first step and the rest)."""
    for indent in ("      ", "    "):
        send = f"{indent}out->send(sendRank, slot, byteOffsets[sendIndex], byteCounts[sendIndex]);\n"
        recv = f"{indent}out->recv(recvRank, slot, byteOffsets[recvIndex], byteCounts[recvIndex]);\n"
        found = text.count(send + recv)
        if found != 1:
            raise SourceChanged(f"allgatherv.cc: expected the send/recv pair indented {len(indent)} once, "
                                f"found it {found} times")
        text = text.replace(send + recv, recv + send)
    return text


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: patch_gloo.py GLOO_SOURCE_DIR", file=sys.stderr)
        return 2
    gloo = Path(argv[0])
    try:
        patched = {name: fix((gloo / name).read_text())
                   for name, fix in (("alltoallv.cc", alltoallv), ("allgatherv.cc", allgatherv))}
    except (OSError, SourceChanged) as e:
        print(f"patch_gloo.py: {gloo}: {e}", file=sys.stderr)
        return 1
    for name, text in patched.items():
        (gloo / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
