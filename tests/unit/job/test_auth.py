"""hvdkeras.job.auth and the rendezvous with a secret: signatures, the time window, replays, the secret file's
checks, and a real server on loopback that answers signed requests only (a foreign client that knows the job
id and port is refused and logged, a recorded request replayed is refused, and the job still forms). The lab
test with a foreign process on a test host: tests/multiworker/test_hosts_2w.py."""

import json
import logging
import os
import socket
import subprocess
import sys

import pytest

from hvdkeras.job import auth
from hvdkeras.job import rendezvous as R

from .test_rendezvous import entry, free_port, launch_env
from .test_rendezvous_bad_input import exchange, put

SECRET = b"s" * 32


def signed_put(path, body, secret=SECRET, now=None):
    headers = auth.sign(secret, "PUT", path, body, now=now)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


def test_a_signature_is_checked_for_the_request_its_time_and_its_nonce():
    clock = [1000.0]
    verifier = auth.Verifier(SECRET, window=60, clock=lambda: clock[0])
    headers = auth.sign(SECRET, "PUT", "/hvdkeras/register", b"{}", now=1000.0)
    assert verifier.refusal("PUT", "/hvdkeras/register", headers, b"{}") is None
    assert "replayed" in verifier.refusal("PUT", "/hvdkeras/register", headers, b"{}")
    fresh = auth.sign(SECRET, "PUT", "/hvdkeras/register", b"{}", now=1000.0)
    assert "wrong" in verifier.refusal("PUT", "/hvdkeras/register", fresh, b'{"rank": 1}')  # body altered
    assert "wrong" in verifier.refusal("GET", "/hvdkeras/register", fresh, b"{}")  # method altered
    assert "wrong" in verifier.refusal("PUT", "/hvdkeras/register",
                                       auth.sign(b"t" * 32, "PUT", "/hvdkeras/register", b"{}", now=1000.0), b"{}")
    assert "no signature" in verifier.refusal("PUT", "/hvdkeras/register", {}, b"{}")
    old = auth.sign(SECRET, "GET", "/hvdkeras/table", now=900.0)
    assert "outside the 60 s window" in verifier.refusal("GET", "/hvdkeras/table", old)
    assert "s" * 32 not in repr(verifier)


def test_the_secret_file_is_checked_and_its_content_never_shown(tmp_path):
    path = tmp_path / "secret"
    with pytest.raises(auth.SecretError, match="readable file"):
        auth.read_secret(str(path))
    path.write_text("short-secret")
    path.chmod(0o600)
    with pytest.raises(auth.SecretError, match="at least 32 bytes.*holding 12 bytes") as err:
        auth.read_secret(str(path))
    assert "short-secret" not in str(err.value)
    path.write_text("x" * 40 + "\n")
    path.chmod(0o644)
    with pytest.raises(auth.SecretError, match="chmod 600.*mode 644"):
        auth.read_secret(str(path))
    path.chmod(0o600)
    assert auth.read_secret(str(path)) == b"x" * 40
    made = auth.write_secret(str(tmp_path))
    assert oct(os.stat(made).st_mode & 0o777) == "0o600" and len(auth.read_secret(made)) == 64


@pytest.fixture
def guarded(caplog):
    caplog.set_level(logging.WARNING, logger="hvdkeras.rendezvous")
    port = free_port()
    reg = R.Registry("job-1", 2, ("WORLD_SIZE=2",), verifier=auth.Verifier(SECRET))
    srv = R.Server("127.0.0.1", port, reg, "test")
    yield port, reg
    srv.stop()


def test_the_rendezvous_answers_signed_requests_only_and_refuses_a_replay(guarded, caplog):
    port, reg = guarded
    body = json.dumps(entry(0)).encode()
    # A client that knows the job id and the port, not the secret: refused, logged with its address.
    status, reply = exchange(port, put("/hvdkeras/register", body))
    assert status == 401 and "no signature" in reply["message"]
    assert "refused PUT '/hvdkeras/register' from 127.0.0.1:" in caplog.text
    assert exchange(port, signed_put("/hvdkeras/register", body, secret=b"w" * 32))[0] == 401
    status, _ = exchange(port, b"GET /hvdkeras/table HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 401 and not reg.entries
    # The job's own, signed: admitted. The same bytes again (a recording): refused as a replay.
    recorded = signed_put("/hvdkeras/register", body)
    assert exchange(port, recorded)[0] == 200
    status, reply = exchange(port, recorded)
    assert status == 401 and "replayed" in reply["message"]
    assert "s" * 32 not in caplog.text


def test_a_job_with_a_secret_forms_and_one_without_it_is_refused(tmp_path):
    # Real workers (threads of this process) joining a real server: the same secret forms the job; a worker
    # with another secret gets an error that says why, and the server carries on.
    port = free_port()
    reg = R.Registry("job-1", 2, ("WORLD_SIZE=2",), verifier=auth.Verifier(SECRET))
    srv = R.Server("127.0.0.1", port, reg, "test")
    try:
        with pytest.raises(R.RendezvousAuthError, match="same secret"):
            R.join(launch_env(1, port), "127.0.0.1", entry(1, host="h1"), timeout=3, secret=b"w" * 32)
        import threading

        tables = {}
        threads = [threading.Thread(target=lambda r=r: tables.__setitem__(
            r, R.join(launch_env(r, port), "127.0.0.1", entry(r, host=f"h{r}"), timeout=10, secret=SECRET)))
            for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(tables) == [0, 1] and sorted(tables[0]) == [0, 1]
    finally:
        srv.stop()


def test_hvdkeras_run_gives_a_one_node_job_a_secret_of_its_own_in_a_file(tmp_path):
    # What the workers of `hvdkeras run --nnodes 1` see: a file path, never the secret, in their environment.
    script = tmp_path / "show.py"
    script.write_text("import json, os, stat, sys\np = os.environ['HVDKERAS_SECRET_FILE']\n"
                      "print(json.dumps({'path': p, 'mode': stat.S_IMODE(os.stat(p).st_mode), "
                      "'bytes': len(open(p).read())}))\n")
    out = subprocess.run([sys.executable, "-m", "hvdkeras.cli.parse", "run", "--nnodes", "1", "--nproc-per-node",
                          "1", str(script)], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "HVDKERAS_SECRET_FILE"})
    line = next(line for line in out.stdout.splitlines() if '"path"' in line)
    shown = json.loads(line[line.index("{"):])
    assert shown["mode"] == 0o600 and shown["bytes"] == 64
    assert not os.path.exists(shown["path"])  # removed when the job ended


def test_horovods_own_keys_need_a_signature_and_each_workers_relay_signs_them(guarded, caplog):
    # Once the job is complete, Horovod's key-value requests from the workers' hosts: unsigned ones are refused
    # (401, logged), whoever sends them; through a worker's relay (what Gloo's C++ store talks to) they are signed
    # and Horovod's answers come back unchanged: 404 for a key not yet set, the value once it is.
    port, reg = guarded
    for rank in (0, 1):
        assert exchange(port, signed_put("/hvdkeras/register", json.dumps(entry(rank)).encode()))[0] == 200
    assert exchange(port, put("/global/0", b"address-of-rank-0"))[0] == 401
    assert exchange(port, b"GET /global/0 HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 401
    assert exchange(port, b"DELETE /global/0 HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 401
    assert "refused PUT '/global/0' from 127.0.0.1:" in caplog.text
    relay = R.Relay(("127.0.0.1", port), SECRET)
    try:
        assert "s" * 32 not in repr(relay)
        # The unsigned PUT above never reached Horovod's store.
        assert exchange(relay.port, b"GET /global/0 HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 404
        assert exchange(relay.port, put("/global/0", b"address-of-rank-0"))[0] == 200
        status, value = exchange(relay.port, b"GET /global/0 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (status, value) == (200, "address-of-rank-0")
        assert exchange(relay.port, b"DELETE /global/0 HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 200
    finally:
        relay.stop()
    relay = R.Relay(("127.0.0.1", free_port()), SECRET)  # rank 0 unreachable: Horovod's client sees a 502, retries
    try:
        assert exchange(relay.port, b"GET /global/0 HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 502
    finally:
        relay.stop()


def _status_as(uid: int, gid: int, port: int) -> str:
    """The status the relay on `port` answers a GET from a process of user `uid` (a child of this one)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then out
        try:
            os.setgid(gid)
            os.setuid(uid)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"GET /global/0 HTTP/1.0\r\n\r\n")
                os.write(write, sock.recv(64).split()[1])
        finally:
            os._exit(0)
    os.close(write)
    try:
        return os.read(read, 16).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)


def test_the_relay_serves_its_own_user_only():
    if os.getuid() != 0:
        pytest.skip("needs root, to connect as another user")
    import pwd

    other = pwd.getpwnam("nobody")
    relay = R.Relay(("127.0.0.1", free_port()), SECRET)
    try:
        assert _status_as(other.pw_uid, other.pw_gid, relay.port) == "403"
        assert _status_as(os.getuid(), os.getgid(), relay.port) == "502"  # served: rank 0 is not there
    finally:
        relay.stop()


def test_peer_uid_reads_the_owner_of_the_connecting_socket(tmp_path):
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 1\n"
        "   1: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2\n")
    from hvdkeras.job.rendezvous.relay import peer_uid

    assert peer_uid(("127.0.0.1", 0x9C40), 0x1F90, str(table)) == 1000
    assert peer_uid(("127.0.0.1", 0x9C41), 0x1F90, str(table)) is None
    assert peer_uid(("127.0.0.1", 0x9C40), 0x1F90, str(tmp_path / "none")) is None


def test_the_verifier_forgets_nonces_past_twice_the_window_and_still_refuses_every_replay_within_it():
    clock = [1000.0]
    verifier = auth.Verifier(SECRET, window=60, clock=lambda: clock[0])
    first = auth.sign(SECRET, "GET", "/global/0", now=1000.0)
    assert verifier.refusal("GET", "/global/0", first) is None
    for step in range(1, 13001):  # Gloo's polling: 100 requests a second for 130 s
        clock[0] = 1000.0 + step / 100
        assert verifier.refusal("GET", "/global/0", auth.sign(SECRET, "GET", "/global/0", now=clock[0])) is None
        if step == 5000:
            assert "replayed" in verifier.refusal("GET", "/global/0", first)
    assert len(verifier._seen) <= 120 * 100 + 1  # the oldest are gone
    assert "outside the 60 s window" in verifier.refusal("GET", "/global/0", first)
