"""Bad input to the rendezvous server: a real server on loopback gets malformed, truncated, oversized and wrongly
typed requests. Each gets a clear answer (what was received, what is expected), is logged with the peer's
address, and the server stays up: a job still forms on it afterwards."""

import json
import logging
import socket

import pytest

from hvdkeras.job import rendezvous as R
from hvdkeras.job.rendezvous import registry

from .test_rendezvous import entry, free_port

GOOD = json.dumps(entry(0)).encode()


def exchange(port: int, raw: bytes, close_write: bool = True, timeout: float = 20.0) -> tuple[int, dict | str]:
    """Sends `raw` bytes as they are, reads the whole answer: (HTTP status, JSON body or text)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(raw)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    if not answer.startswith(b"HTTP/"):  # an HTTP/0.9 answer: the body alone
        return 0, answer.decode(errors="replace")
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


def put(path: str, body: bytes, length: str | None = "auto") -> bytes:
    header = "" if length is None else f"Content-Length: {len(body) if length == 'auto' else length}\r\n"
    return f"PUT {path} HTTP/1.1\r\nHost: x\r\n{header}\r\n".encode() + body


def registration(fields: dict) -> bytes:
    return put("/hvdkeras/register", json.dumps(fields).encode())


CASES = {
    "not JSON": (put("/hvdkeras/register", b"rank=0&size=2"), 400, "a registration must be JSON"),
    "truncated JSON": (put("/hvdkeras/register", GOOD[:40]), 400, "a registration must be JSON"),
    "body cut short": (put("/hvdkeras/register", GOOD[:40], length=str(len(GOOD))), 400,
                       f"Content-Length {len(GOOD)} announced, 40 bytes received"),
    "no Content-Length": (put("/hvdkeras/register", b"", length=None), 411, "needs a Content-Length header"),
    "Content-Length not a number": (put("/hvdkeras/register", b"{}", length="lots"), 400,
                                    "Content-Length must be a number of bytes; received 'lots'"),
    "oversized": (put("/hvdkeras/register", b"{}", length=str(10 ** 12)), 413,
                  "at most 65536 bytes is expected here; received Content-Length 1000000000000"),
    "a list": (registration([0, 2]), 400, "must be a JSON object with the fields job_id, rank"),
    "a field missing": (registration({k: v for k, v in entry(0).items() if k != "pid"}), 400,
                        "needs the field `pid` (an integer >= 0)"),
    "rank a string": (registration(dict(entry(0), rank="zero")), 400,
                      "`rank` must be an integer >= 0, below size; received 'zero'"),
    "rank a bool": (registration(dict(entry(0), rank=True)), 400, "`rank` must be an integer"),
    "rank beyond size": (registration(dict(entry(0), rank=5)), 400, "received rank 5 and size 2"),
    "size zero": (registration(dict(entry(0), size=0)), 400, "`size` must be an integer >= 1; received 0"),
    "port out of range": (registration(dict(entry(0), probe_port=70000)), 400, "`probe_port` must be an integer"),
    "variables not strings": (registration(dict(entry(0), variables=[1])), 400, "`variables` must be a list"),
    "a huge string": (registration(dict(entry(0), hostname="h" * 60000)), 200, ""),  # within the limit: fine
}


@pytest.fixture
def server(caplog, monkeypatch):
    monkeypatch.setattr(registry, "BODY_TIMEOUT", 1.0)
    caplog.set_level(logging.WARNING, logger="hvdkeras.rendezvous")
    port = free_port()
    done = []
    reg = R.Registry("job-1", 2, ("WORLD_SIZE=2",))
    srv = R.Server("127.0.0.1", port, reg, "test")
    yield port, reg, done
    srv.stop()


def test_each_bad_request_gets_a_clear_answer_is_logged_and_the_server_stays_up(server, caplog):
    port, reg, _ = server
    for name, (raw, status, message) in CASES.items():
        got, body = exchange(port, raw)
        assert got == status, (name, got, body)
        if message:
            assert message in body["message"], (name, body)
            assert "from 127.0.0.1:" in caplog.text and message[:30] in caplog.text, name
        if name == "a huge string":
            reg.entries.clear()  # the test's own registration: forget it
    # A client that announces a body and never sends it holds only its own connection, for BODY_TIMEOUT.
    got, body = exchange(port, put("/hvdkeras/register", b"{", length="500"), close_write=False)
    assert got == 400 and "1 bytes received within 1 s" in body["message"], body
    # Not HTTP at all: the standard library's own answer, "Bad request".
    got, text = exchange(port, b"\x00\x01garbage\r\n\r\n")
    assert got in (0, 400) and "Bad request" in text, text
    # Horovod's own keys: refused (and logged) before the job is complete, whatever the body.
    got, _ = exchange(port, put("/global/rank_0", b"x"))
    assert got == 403 and "not a host of this job's registered workers" in caplog.text
    # Still up: both ranks register and the table is complete.
    assert exchange(port, registration(entry(0)))[0] == 200
    assert exchange(port, registration(entry(1, host="h1")))[0] == 200
    status, table = exchange(port, b"GET /hvdkeras/table HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and sorted(table["entries"]) == ["0", "1"] and table["conflict"] is None
    # Once admitted, Horovod's keys get the size limit too, checked before its handler reads the body.
    got, body = exchange(port, put("/global/rank_0", b"x", length=str(1 << 30)))
    assert got == 413 and "at most 1048576 bytes" in body["message"]
    assert exchange(port, put("/global/rank_0", b"addr"))[0] == 200
