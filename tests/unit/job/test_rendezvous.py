"""The rendezvous: the registry's admission rules, rank assignment for any layout, and a real in-process
server with workers in threads (bad input fails within the bound, naming addresses and ranks)."""

import socket
import threading

import pytest

from hvdkeras.job import rendezvous as R
from hvdkeras.job.launchers import LaunchEnv


def entry(rank, size=2, host="h0", pid=None, job="job-1"):
    return {"job_id": job, "rank": rank, "size": size, "hostname": host, "host_key": host, "ip": "127.0.0.1",
            "pid": pid if pid is not None else 100 + rank, "probe_port": 1, "variables": [f"WORLD_SIZE={size}"]}


def test_registry_completes_once_and_then_admits_only_registered_hosts():
    done = []
    reg = R.Registry("job-1", 2, ("WORLD_SIZE=2",), on_complete=done.append)
    assert reg.register(entry(0), "10.0.0.1")[0] == 200
    assert not reg.admits("10.0.0.1")  # Horovod's requests wait for the whole job
    assert reg.register(entry(1, host="h1"), "10.0.0.2")[0] == 200
    assert len(done) == 1 and sorted(done[0]) == [0, 1]
    assert reg.admits("10.0.0.2") and not reg.admits("10.0.0.9")


def test_registry_refuses_other_jobs_other_sizes_and_second_claims():
    reg = R.Registry("job-1", 2, ("WORLD_SIZE=2",))
    assert reg.register(entry(0, job="job-2"), "1.1.1.1") == (403, {"error": "other-job", "job_id": "job-1"})
    status, reply = reg.register(entry(1, size=3), "1.1.1.1")
    assert status == 409 and "rank 0 says 2 (WORLD_SIZE=2)" in reply["message"] and "says 3" in reply["message"]
    assert reg.table()["conflict"] == reply["message"]
    reg = R.Registry("job-1", 2, ())
    reg.register(entry(0), "1.1.1.1")
    reg.register(entry(1), "1.1.1.1")
    status, reply = reg.register(entry(1, pid=999), "1.1.1.1")
    assert status == 409 and "rank 1 is already in the job" in reply["message"]
    assert reg.table()["conflict"] is None  # a late intruder does not break the formed job
    assert reg.register(entry(1), "1.1.1.1")[0] == 200  # the same process again (a retry) is fine


@pytest.mark.parametrize("hosts, expected", [
    # block layout: ranks 0,1 on a and 2,3 on b
    (["a", "a", "b", "b"], [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]),
    # cyclic layout (srun --distribution=cyclic): ranks alternate between hosts
    (["a", "b", "a", "b"], [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)]),
    # uneven: 2 on a, 1 on b
    (["a", "a", "b"], [(0, 2, 0, 2), (1, 2, 0, 1), (0, 1, 1, 2)]),
])
def test_assign_local_and_cross_ranks_for_any_layout(hosts, expected):
    got = R.assign({r: {"host_key": h} for r, h in enumerate(hosts)})
    assert [(g["local_rank"], g["local_size"], g["cross_rank"], g["cross_size"]) for _, g in sorted(got.items())] \
        == expected


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env(rank, port, size=2, job="job-1"):
    return LaunchEnv(launcher="torchrun/Kubernetes", variables=(f"RANK={rank}", f"WORLD_SIZE={size}"), rank=rank,
                     size=size, local_rank=rank, local_size=size, rendezvous_addr="127.0.0.1", rendezvous_port=port,
                     addr_source="MASTER_ADDR", job_id=job)


def join_in_threads(envs, timeout=5.0):
    """Runs each env's side of the handshake in a thread (rank 0 hosting); returns results or errors."""
    servers, results = [], {}
    for env in envs:
        if env.rank == 0:
            servers.append(R.Server("127.0.0.1", env.rendezvous_port, R.Registry(env.job_id, env.size, env.variables),
                                    "test"))

    def run(i, env):
        try:
            results[i] = R.join(env, "127.0.0.1", entry(env.rank, env.size, pid=1000 + i, job=env.job_id), timeout)
        except Exception as err:  # noqa: BLE001 - the test inspects it
            results[i] = err

    threads = [threading.Thread(target=run, args=(i, env)) for i, env in enumerate(envs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    for server in servers:
        server.stop()
    return results


def test_real_server_forms_the_table():
    port = free_port()
    results = join_in_threads([launch_env(0, port), launch_env(1, port)])
    assert sorted(results[0]) == sorted(results[1]) == [0, 1]


def test_worker_of_another_job_is_refused_at_once():
    port = free_port()
    results = join_in_threads([launch_env(0, port), launch_env(1, port, job="job-2")], timeout=3)
    assert isinstance(results[1], R.RendezvousOtherJobError)
    assert isinstance(results[0], R.RendezvousTimeoutError)
    assert "belongs to another job (job id 'job-1'); this worker is of job 'job-2'" in str(results[1])
    assert "Ranks [1] of 2 never joined" in str(results[0]) and "within 3 s" in str(results[0])


def test_unreachable_rendezvous_names_the_address():
    port = free_port()
    results = join_in_threads([launch_env(1, port)], timeout=1)
    assert isinstance(results[0], R.RendezvousConnectionError)
    assert f"could not reach the job's rendezvous at 127.0.0.1:{port} within 1 s" in str(results[0])
    assert "Connection refused" in str(results[0])


def test_second_server_on_a_held_port_says_so():
    port = free_port()
    first = R.Server("127.0.0.1", port, R.Registry("a", 2, ()), "test")
    try:
        with pytest.raises(R.RendezvousPortInUseError, match="Another job .* holds this port"):
            R.Server("127.0.0.1", port, R.Registry("b", 2, ()), "test")
    finally:
        first.stop()


def test_server_binds_only_the_address_the_workers_use_and_goes_away():
    port = free_port()
    server = R.Server("127.0.0.1", port, R.Registry("a", 2, ()), "test")
    try:
        assert server.httpd.server_address == ("127.0.0.1", port)  # not 0.0.0.0
        with pytest.raises(OSError):  # another local address of this host does not reach it
            socket.create_connection(("127.0.0.2", port), timeout=1).close()
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_unresolvable_host_names_the_variable():
    with pytest.raises(R.RendezvousAddressError, match="MASTER_ADDR gave 'no-such-host.invalid'"):
        R.resolve("no-such-host.invalid", "MASTER_ADDR")


def test_unreachable_peers_are_named():
    alive = R.Probe("127.0.0.1")
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        dead_port = dead.getsockname()[1]
    peers = {0: {"hostname": "a", "ip": "127.0.0.1", "probe_port": alive.port},
             1: {"hostname": "b", "ip": "127.0.0.1", "probe_port": dead_port},
             2: {"hostname": "c", "ip": "127.0.0.1", "probe_port": alive.port}}
    assert R.unreachable_peers(peers, me=0) == ["rank 1 on b (127.0.0.1)"]


@pytest.mark.parametrize("raw", ["0", "-1", "soon"])
def test_bad_rendezvous_timeout(raw):
    with pytest.raises(ValueError, match=f"HVDKERAS_RENDEZVOUS_TIMEOUT must be a number of seconds > 0. Received: "
                                         f"HVDKERAS_RENDEZVOUS_TIMEOUT='{raw}'"):
        R.rendezvous_timeout({"HVDKERAS_RENDEZVOUS_TIMEOUT": raw})


def test_every_failure_has_its_own_rendezvous_error_subclass():
    subclasses = [R.RendezvousAddressError, R.RendezvousPortInUseError, R.RendezvousBindError,
                  R.RendezvousConnectionError, R.RendezvousOtherJobError, R.RendezvousConflictError,
                  R.RendezvousProtocolError, R.RendezvousTimeoutError, R.RendezvousSizeError]
    assert len(set(subclasses)) == len(subclasses)
    assert all(issubclass(c, R.RendezvousError) and c is not R.RendezvousError for c in subclasses)
    assert issubclass(R.RendezvousError, RuntimeError)


def test_a_second_claim_on_a_rank_is_a_conflict():
    port = free_port()
    results = join_in_threads([launch_env(0, port), launch_env(1, port), launch_env(1, port)], timeout=3)
    errors = [r for r in results.values() if isinstance(r, Exception)]
    assert errors and all(isinstance(e, R.RendezvousConflictError) for e in errors), results
    assert any("claims the same rank" in str(e) for e in errors)


def test_stop_restores_the_excepthook_the_rendezvous_installed(monkeypatch):
    import sys

    from hvdkeras.job.rendezvous import diagnosis

    before = sys.excepthook
    diagnosis.install_excepthook({0: {}, 1: {}}, 0)
    assert sys.excepthook is not before
    R.stop()
    assert sys.excepthook is before
