"""The lab: a real Slurm on this host, and two test hosts made of network namespaces with sshd.

Used by the multi-worker tests and by the network benchmarks alike (`make install` puts this folder on the
venv's path). Everything here is made by its user and torn down after it. Traffic goes only to loopback and to
the addresses of the namespaces made here. `missing(...)` says what a machine lacks (root, `ip`, a package;
scripts/install_lab.sh installs the packages).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

# Pod 0's name through the Kubernetes manifest's headless Service (examples/kubernetes_indexed_job.yaml):
# the session's test hosts give it to hosta.
POD0 = "hvdkeras-digits-0.hvdkeras-digits"


def missing(*commands: str, root: bool = True) -> str | None:
    """Why the lab cannot run here (not root, or commands not on PATH), or None when it can."""
    if root and os.geteuid() != 0:
        return "needs root (network namespaces, daemons)"
    absent = [c for c in commands if shutil.which(c) is None]
    if absent:
        return f"needs {', '.join(absent)} (scripts/install_lab.sh installs them)"
    return None


def kill_tree(pid: int) -> None:
    """Kills a process and all its descendants, and waits for them."""
    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = parent.children(recursive=True) + [parent]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def _run(*cmd: str, check: bool = True, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


def _wait(what: str, ok, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.3)
    tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
    raise RuntimeError(f"{what} did not come up within {timeout:g} s\n{tail}")


class Daemons:
    """Processes started in the background, each in its own session, all killed by stop()."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def start(self, cmd: list[str], log: Path, **kw) -> subprocess.Popen:
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            kill_tree(proc.pid)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()


# --------------------------------------------------------------------------------------------- Slurm
class Slurm:
    """munged + slurmctld + slurmd for this host, with a configuration, ports and state of their own."""

    def __init__(self, root: Path):
        self.root = root
        self.node = socket.gethostname()
        self.conf = root / "slurm.conf"
        # munged runs as the munge user, who cannot enter pytest's root-only folders: a folder of its own.
        self.munge_dir = Path(tempfile.mkdtemp(prefix="hvdkeras-munge-"))
        self.munge_socket = self.munge_dir / "munge.socket"
        self.daemons = Daemons()

    @property
    def env(self) -> dict:
        return {"SLURM_CONF": str(self.conf)}

    def _munge(self) -> None:
        d = self.munge_dir
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        shutil.chown(d, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        self.daemons.start(["runuser", "-u", "munge", "--", "munged", "--foreground", "--force",
                            f"--socket={self.munge_socket}", f"--key-file={key}", f"--pid-file={d / 'munged.pid'}",
                            f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"],
                           self.root / "munged.out")
        _wait("munged", self.munge_socket.exists, 20, self.root / "munged.out")

    def _write_conf(self) -> None:
        for sub in ("state", "spool"):
            (self.root / sub).mkdir()
        cpus = os.cpu_count() or 2
        self.conf.write_text("\n".join([
            "ClusterName=hvdkeraslab",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            "SlurmctldPort=16817",
            "SlurmdPort=16818",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'slurmd.log'}",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            "PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
            "",
        ]))

    def idle(self) -> bool:
        proc = _run("sinfo", "-h", "-o", "%t", check=False, env=dict(os.environ, **self.env))
        return proc.returncode == 0 and proc.stdout.strip() in ("idle", "mix", "alloc")

    def start(self) -> "Slurm":
        try:
            self._munge()
            self._write_conf()
            env = dict(os.environ, **self.env)
            self.daemons.start(["slurmctld", "-D", "-i", "-f", str(self.conf)], self.root / "slurmctld.out", env=env)
            self.daemons.start(["slurmd", "-D", "-f", str(self.conf), "-N", self.node], self.root / "slurmd.out",
                               env=env)
            _wait("Slurm (sinfo idle)", self.idle, 60, self.root / "slurmd.log")
        except BaseException:
            self.stop()
            raise
        return self

    def wait_job(self, job_id: str, timeout: float) -> tuple[str, int]:
        """(final state, exit code) of a batch job, polled every 0.5 s; cancels it and fails on a timeout."""
        env = dict(os.environ, **self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = _run("scontrol", "show", "job", "-o", job_id, check=False, env=env).stdout
            fields = dict(f.split("=", 1) for f in info.split() if "=" in f)
            state = fields.get("JobState", "")
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"):
                return state, int(fields.get("ExitCode", "0:0").split(":")[0])
            time.sleep(0.5)
        _run("scancel", job_id, check=False, env=env)
        raise RuntimeError(f"batch job {job_id} did not finish within {timeout:g} s\n{self.logs()}")

    def logs(self) -> str:
        logs = sorted(self.root.glob("*.log")) + sorted(self.munge_dir.glob("*.log"))
        return "".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in logs)

    def stop(self) -> None:
        if self.conf.exists() and self.daemons.procs:
            _run("scancel", "--full", "-u", "root", check=False, timeout=60, env=dict(os.environ, **self.env))
        self.daemons.stop()
        shutil.rmtree(self.munge_dir, ignore_errors=True)


# ------------------------------------------------------------------------------------ two test hosts
class LabHosts:
    """Two test hosts: network namespaces joined by a veth pair, each with its own address and /etc/hosts.

    Both ends of the link have the same interface name (horovodrun looks for an interface common to all
    hosts). Each /etc/hosts maps this machine's host name to a loopback address, as many distributions
    and containers do: that is what Horovod 0.28.1's unpatched process-set Gloo context binds to.
    """

    NAMES = ("hosta", "hostb")
    IFACE = "hklab0"

    def __init__(self, root: Path, subnet: int = 77, aliases: dict[str, list[str]] | None = None):
        self.root = root
        self.aliases = aliases or {}  # more names for a host, in every host's /etc/hosts
        tag = f"{os.getpid() % 100000}"
        self.netns = {name: f"hvdk-{name[-1]}-{tag}" for name in self.NAMES}
        self.addr = {name: f"10.{subnet}.0.{i + 1}" for i, name in enumerate(self.NAMES)}
        self.daemons = Daemons()
        self.rate: str | None = None

    def ns(self, host: str, *cmd: str) -> list[str]:
        """The command line that runs `cmd` on test host `host`."""
        return ["ip", "netns", "exec", self.netns[host], *cmd]

    def run(self, host: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run(*self.ns(host, *cmd), check=check)

    @staticmethod
    def remove_stale() -> None:
        """Removes the test hosts of earlier runs whose pytest process is gone (killed before teardown)."""
        import psutil

        listed = _run("ip", "netns", "list", check=False).stdout.split()
        for ns in (n for n in listed if n.startswith("hvdk-")):
            owner = ns.rsplit("-", 1)[-1]
            if owner.isdigit() and not any(p.pid % 100000 == int(owner) for p in psutil.process_iter()):
                for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                    kill_tree(int(pid))
                _run("ip", "netns", "del", ns, check=False)
                shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)

    def start(self) -> "LabHosts":
        a, b = self.NAMES
        self.remove_stale()
        try:
            for host in self.NAMES:
                _run("ip", "netns", "add", self.netns[host])
                etc = Path("/etc/netns") / self.netns[host]
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text(
                    "127.0.0.1 localhost\n"
                    f"127.0.1.1 {socket.gethostname()}\n"
                    + "".join(f"{self.addr[h]} {' '.join([h, *self.aliases.get(h, [])])}\n" for h in self.NAMES))
            tmp_a, tmp_b = f"hkva{os.getpid() % 100000}", f"hkvb{os.getpid() % 100000}"
            _run("ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b)
            for host, dev in ((a, tmp_a), (b, tmp_b)):
                _run("ip", "link", "set", dev, "netns", self.netns[host])
                self.run(host, "ip", "link", "set", dev, "name", self.IFACE)
                self.run(host, "ip", "addr", "add", f"{self.addr[host]}/24", "dev", self.IFACE)
                self.run(host, "ip", "link", "set", self.IFACE, "up")
                self.run(host, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.stop()
            raise
        return self

    def shape(self, rate: str, burst: str = "256kb", latency: str = "400ms") -> None:
        """Limits the link to `rate` (tbf: this kernel has no netem) in both directions."""
        for host in self.NAMES:
            self.run(host, "tc", "qdisc", "replace", "dev", self.IFACE, "root", "tbf", "rate", rate,
                     "burst", burst, "latency", latency)
        self.rate = rate

    def unshape(self) -> None:
        for host in self.NAMES:
            self.run(host, "tc", "qdisc", "del", "dev", self.IFACE, "root", check=False)
        self.rate = None

    def transfer(self, nbytes: int, port: int = 29599, timeout: float = 60) -> float:
        """Sends `nbytes` over TCP from the first host to the second; returns the seconds it took."""
        import sys

        a, b = self.NAMES
        server = subprocess.Popen(self.ns(b, sys.executable, "-c",
                                          "import socket,sys; s=socket.create_server((sys.argv[1], int(sys.argv[2]))); "
                                          "c,_=s.accept(); n=0\nwhile (d:=c.recv(1<<20)): n+=len(d)\nprint(n)",
                                          self.addr[b], str(port)), stdout=subprocess.PIPE, text=True)
        try:
            client = _run(*self.ns(a, sys.executable, "-c",
                                   "import socket,sys,time\nfor _ in range(100):\n try:\n  c=socket.create_connection("
                                   "(sys.argv[1], int(sys.argv[2]))); break\n except OSError: time.sleep(0.1)\n"
                                   "t=time.monotonic(); c.sendall(b'x'*int(sys.argv[3])); c.shutdown(1); c.recv(1); "
                                   "print(time.monotonic()-t)", self.addr[b], str(port), str(nbytes)), timeout=timeout)
            received = int(server.communicate(timeout=timeout)[0].strip())
        finally:
            kill_tree(server.pid)
        if received != nbytes:
            raise RuntimeError(f"sent {nbytes} bytes between the test hosts, {received} arrived")
        return float(client.stdout.strip())

    def cut(self) -> None:
        """Takes the link between the hosts down."""
        for host in self.NAMES:
            self.run(host, "ip", "link", "set", self.IFACE, "down", check=False)

    def heal(self) -> None:
        """Brings the link back up (the addresses stay; the kernel restores their routes)."""
        for host in self.NAMES:
            self.run(host, "ip", "link", "set", self.IFACE, "up")

    def processes(self) -> dict[str, list[int]]:
        """The pids running on each test host (what a test expects to be empty after a job)."""
        out = {}
        for host, ns in self.netns.items():
            proc = _run("ip", "netns", "pids", ns, check=False)
            pids = [int(p) for p in proc.stdout.split()]
            ours = {p.pid for p in self.daemons.procs}
            out[host] = [p for p in pids if p not in ours and not _is_daemon_child(p, ours)]
        return out

    # ----------------------------------------------------------------------------------------- sshd
    def start_sshd(self) -> Path:
        """sshd on port 22 of each host, with a host key and a client key made for this run.

        Returns a folder with an `ssh` wrapper to put first on PATH: it uses this run's key and
        known-hosts file, so nothing in the user's ~/.ssh is read or written.
        """
        ssh = self.root / "ssh"
        ssh.mkdir()
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "host_key"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "id"))
        shutil.copy(ssh / "id.pub", ssh / "authorized_keys")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        for host in self.NAMES:
            cfg = ssh / f"sshd_{host}.conf"
            cfg.write_text("\n".join([
                "Port 22", f"ListenAddress {self.addr[host]}", f"HostKey {ssh / 'host_key'}",
                f"AuthorizedKeysFile {ssh / 'authorized_keys'}", "PermitRootLogin prohibit-password",
                "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
                f"PidFile {ssh / f'sshd_{host}.pid'}", "AcceptEnv *", "MaxStartups 50", ""]))
            self.daemons.start(self.ns(host, "/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)),
                               ssh / f"sshd_{host}.log")
        (ssh / "config").write_text("\n".join([
            "Host *", f"  IdentityFile {ssh / 'id'}", f"  UserKnownHostsFile {ssh / 'known_hosts'}",
            "  StrictHostKeyChecking no", "  LogLevel ERROR", "  BatchMode yes", "  ConnectTimeout 10", ""]))
        wrapper = ssh / "bin"
        wrapper.mkdir()
        (wrapper / "ssh").write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F {ssh / 'config'} \"$@\"\n")
        (wrapper / "ssh").chmod(0o755)
        a, b = self.NAMES

        def reachable() -> bool:
            proc = _run(*self.ns(a, str(wrapper / "ssh"), b, "true"), check=False)
            return proc.returncode == 0

        _wait("sshd on the test hosts", reachable, 30, ssh / f"sshd_{b}.log")
        return wrapper

    def stop(self) -> None:
        self.daemons.stop()
        for ns in self.netns.values():
            proc = _run("ip", "netns", "pids", ns, check=False)
            for pid in proc.stdout.split():
                kill_tree(int(pid))
            _run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


def _is_daemon_child(pid: int, daemons: set[int]) -> bool:
    import psutil

    try:
        return any(p.pid in daemons for p in psutil.Process(pid).parents())
    except psutil.NoSuchProcess:
        return False
