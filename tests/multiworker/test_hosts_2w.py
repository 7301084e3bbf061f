"""Across two test hosts (network namespaces joined by a veth pair): one job of two workers, one per host.

Each host's /etc/hosts maps this machine's host name to a loopback address, so these tests also fail
without the Horovod patch in scripts/install_horovod.sh (Horovod 0.28.1's process-set Gloo context
ignores HOROVOD_GLOO_IFACE and binds to what the host name resolves to).
"""

import json
import os
import sys
import time

import pytest
from jobcheck import SCRIPTS, check_two_workers, lines_by_rank, run_args, worker_command

from netlab import POD0, LabHosts

from launch import REPO, VENV_BIN, WORKERS, Started, require, run_command, show

LAUNCH_TIMEOUT = 300
HVDKERAS = str(VENV_BIN / "hvdkeras")


MANIFEST = REPO / "examples" / "kubernetes_indexed_job.yaml"


def node_command(hosts: LabHosts, node: int, args: list[str], port: int, *extra: str) -> list[str]:
    host = hosts.NAMES[node]
    return hosts.ns(host, HVDKERAS, "run", "--nnodes", "2", "--node-rank", str(node), "--master-addr",
                    hosts.NAMES[0], "--master-port", str(port), *extra, *args)


@pytest.mark.parametrize("kind", SCRIPTS)
def test_ssh_less_run_on_each_host_forms_one_job(hosts, tmp_path, kind):
    """With "plain", the job has a secret (the same file on both hosts), and a process on the second host that
    knows the job id and port but not the secret tries to register, read the table and stall the rendezvous
    while the job forms: it is refused each time, the job forms and trains, and the secret appears in no
    command line and no output."""
    port = 29610 + SCRIPTS.index(kind)
    extra, env, started, secret = (), {}, [], None
    if kind == "plain":
        secret = os.urandom(32).hex()
        secret_file = tmp_path / "secret"
        secret_file.write_text(secret)
        secret_file.chmod(0o600)
        extra, env = ("--job-id", "lab-job"), {"HVDKERAS_SECRET_FILE": str(secret_file)}
        started = [(hosts.ns("hostb", sys.executable, str(WORKERS / "intruder.py"), hosts.addr["hosta"],
                             str(port), "lab-job", str(tmp_path / "intruder.json"), "25"), {})]
    commands = [(node_command(hosts, n, run_args(kind, tmp_path, tmp_path / "model" / str(n)), port, *extra), env)
                for n in (0, 1)] + started
    running = Started(commands, tmp_path)
    seen = [] if secret is None else _command_lines_while(running, seconds=20)
    results = running.wait(LAUNCH_TIMEOUT)
    assert [r.returncode for r in results] == [0] * len(commands), show(results)
    if secret is not None:
        answers = json.loads((tmp_path / "intruder.json").read_text())
        print("the intruder's answers:", {k: sorted(set(v)) if isinstance(v, list) else v for k, v in answers.items()})
        assert answers["register"] and set(answers["register"]) == {401}, answers
        assert answers["table"] and set(answers["table"]) == {401}, answers
        assert set(answers["stall"]) <= {"400"}, answers
        assert f"refused PUT '/hvdkeras/register' from {hosts.addr['hostb']}" in results[0].output
        assert seen and not any(secret in line for line in seen), "the secret is on a command line"
        outputs = "".join(r.output for r in results) + "".join(p.read_text(errors="replace")
                                                               for p in tmp_path.rglob("*.log"))
        assert secret not in outputs
        results = results[:2]
    lines = {}
    for result in results:
        for rank, rank_lines in lines_by_rank(result.output, "horovodrun").items():
            lines.setdefault(rank, []).extend(rank_lines)
    reports = check_two_workers(tmp_path, kind, lines)
    assert all(reports[r]["size"] == 2 for r in (0, 1))
    if kind == "init":  # one worker per host: each is alone on its host, and two hosts cross
        assert [reports[r]["local_rank"] for r in (0, 1)] == [0, 0]
        assert [reports[r]["cross_size"] for r in (0, 1)] == [2, 2]
        # Across hosts hvdkeras sets Horovod's cycle time to 5 ms (unless set).
        assert [reports[r]["horovod_cycle_time"] for r in (0, 1)] == ["5", "5"]
        # ... and gives the threads Horovod started (its background thread, Gloo's) nice -15; root may.
        for r in (0, 1):
            assert reports[r]["horovod_threads_nice"] and set(reports[r]["horovod_threads_nice"]) == {-15}, reports[r]
            assert reports[r]["main_thread_nice"] == 0
    assert hosts.processes() == {"hosta": [], "hostb": []}


def _command_lines_while(running, seconds: float) -> list[str]:
    """Every process's command line on this machine, read every 0.5 s for `seconds` (or until `running` ends)."""
    import psutil

    seen, end = [], time.monotonic() + seconds
    while time.monotonic() < end and any(p.poll() is None for p in running.procs):
        for proc in psutil.process_iter(["cmdline"]):
            seen.append(" ".join(proc.info["cmdline"] or []))
        time.sleep(0.5)
    return seen


@pytest.mark.parametrize("kind", SCRIPTS)
def test_torchrun_across_the_two_hosts_forms_one_job(hosts, tmp_path, kind):
    """`torchrun --nnodes 2` once on each host (static rendezvous at hosta): its store holds the master port
    on hosta, and hvdkeras's rendezvous finds another."""
    torchrun = VENV_BIN / "torchrun"
    assert torchrun.exists(), "torchrun is missing: make install puts the torch extra in .venv"
    port = 29630 + SCRIPTS.index(kind)
    commands = [(hosts.ns(host, str(torchrun), "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "1",
                          "--master-addr", hosts.NAMES[0], "--master-port", str(port), "--tee", "3", "--no-python",
                          *worker_command(kind, tmp_path, "RANK")), {})
                for n, host in enumerate(hosts.NAMES)]
    results = Started(commands, tmp_path).wait(LAUNCH_TIMEOUT)
    assert [r.returncode for r in results] == [0, 0], show(results)
    # Each host's torchrun prefixes its one worker's lines with its local rank, 0: the host is the rank.
    lines = {n: lines_by_rank(results[n].output, "torchrun").get(0, []) for n in (0, 1)}
    check_two_workers(tmp_path, kind, lines)
    assert hosts.processes() == {"hosta": [], "hostb": []}


@pytest.fixture(scope="module")
def ssh_path(hosts):
    require("sshd", "ssh", "ssh-keygen")
    return hosts.start_sshd()


@pytest.mark.parametrize("kind", SCRIPTS)
def test_hvdkeras_run_over_ssh_forms_one_job(hosts, ssh_path, tmp_path, kind):
    a, b = hosts.NAMES
    cmd = hosts.ns(a, HVDKERAS, "run", "-np", "2", "-H", f"{a}:1,{b}:1",
                   *run_args(kind, tmp_path, tmp_path / "model" / "0"))
    job = run_command(cmd, tmp_path, timeout=LAUNCH_TIMEOUT,
                      env={"PATH": os.pathsep.join([str(ssh_path), str(VENV_BIN), os.environ["PATH"]])})
    if job.returncode != 0:
        job.fail(f"hvdkeras run -H over ssh exited {job.returncode}")
    check_two_workers(tmp_path, kind, lines_by_rank(job.output, "horovodrun"), shared_dir=True)
    assert hosts.processes() == {"hosta": [], "hostb": []}


def test_lab_link_can_be_shaped(hosts):
    require("tc")
    plain = hosts.transfer(4_000_000)
    hosts.shape("100mbit")
    try:
        qdisc = hosts.run(hosts.NAMES[0], "tc", "qdisc", "show", "dev", hosts.IFACE).stdout
        assert "tbf" in qdisc and "rate 100Mbit" in qdisc, qdisc
        shaped = hosts.transfer(4_000_000)
    finally:
        hosts.unshape()
    print(f"4 MB between the test hosts: {plain * 1e3:.0f} ms unshaped, {shaped * 1e3:.0f} ms at 100mbit "
          f"({4e6 * 8 / shaped / 1e6:.0f} Mbit/s)")


STALL = 15


def test_cut_link_ends_both_workers_naming_the_lost_peer(hosts, tmp_path):
    commands = [(node_command(hosts, n, run_args("init", tmp_path, tmp_path / "model" / str(n), epochs=200), 29620,
                              "--stall-timeout", str(STALL)), {}) for n in (0, 1)]
    running = Started(commands, tmp_path)
    try:
        deadline = time.monotonic() + 180
        log = tmp_path / "proc0.log"
        while time.monotonic() < deadline and "Epoch 3/" not in log.read_text():
            assert all(p.poll() is None for p in running.procs), log.read_text()[-3000:]
            time.sleep(0.5)
        assert "Epoch 3/" in log.read_text(), "training did not start"
        cut = time.monotonic()
        hosts.cut()
        results = running.wait(STALL + 30 + 60)
        ended = time.monotonic() - cut
    finally:
        running.kill()
        hosts.heal()
    assert all(r.returncode != 0 for r in results), show(results)
    assert ended <= STALL + 30, f"the workers took {ended:.1f} s to exit after the cut\n{show(results)}"
    assert "unreachable: rank 1 on" in results[0].output and "(10." in results[0].output, show(results)
    assert "unreachable: rank 0 on" in results[1].output, show(results)
    assert hosts.processes() == {"hosta": [], "hostb": []}
    print(f"cut link: both workers exited {ended:.1f} s after the cut (stall timeout {STALL} s)")


def pod_commands(out):
    """Each pod's (argv, env) exactly as examples/kubernetes_indexed_job.yaml gives them, with the downward
    API filled in as Kubernetes does, the interpreter and paths of this checkout, and a 1-epoch run."""
    import yaml

    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    job = next(d for d in docs if d["kind"] == "Job")
    service = next(d for d in docs if d["kind"] == "Service")
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert f"{job['metadata']['name']}-0.{pod['subdomain']}" == POD0 and service["metadata"]["name"] == pod["subdomain"]
    pods = []
    for index in range(job["spec"]["completions"]):
        downward = {"metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index),
                    "metadata.labels['batch.kubernetes.io/controller-uid']": "3f1c-uid-of-this-job"}
        env = {e["name"]: e["value"] if "value" in e else downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
               for e in container["env"]}
        argv = list(container["command"])
        assert argv[:3] == ["python", "-m", "hvdkeras"]
        argv[0] = sys.executable
        argv = [str(REPO / a) if a.endswith(".py") else a for a in argv]
        argv[argv.index("--epochs") + 1] = "1"
        argv[argv.index("--out-dir") + 1] = str(out / "model" / str(index))
        pods.append((argv, {**env, "HVDKERAS_REPORT_DIR": str(out / "report")}))
    assert all(int(env["WORLD_SIZE"]) == len(pods) for _, env in pods)
    return pods


def test_kubernetes_indexed_job_manifest_forms_one_job(hosts, tmp_path):
    """The manifest's two pods, each in its own network namespace as pods are, pod 0 reached by its DNS name."""
    pods = pod_commands(tmp_path)
    results = Started([(hosts.ns(hosts.NAMES[i], *argv), env) for i, (argv, env) in enumerate(pods)],
                      tmp_path).wait(LAUNCH_TIMEOUT)
    assert [r.returncode for r in results] == [0, 0], show(results)
    check_two_workers(tmp_path, "plain", {i: r.output.splitlines() for i, r in enumerate(results)})
    assert hosts.processes() == {"hosta": [], "hostb": []}
