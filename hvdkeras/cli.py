"""`hvdkeras run | check`: parse -> validate -> pure build_command -> exec.

    hvdkeras run -np 2 [-H host1:2,host2:2] [--lr-scaling linear] [...] train.py [script args]
    hvdkeras run --nnodes 2 --node-rank I --master-addr node0 [--nproc-per-node 1] train.py   (on every node)
    hvdkeras check
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from typing import Callable, Sequence

from hvdkeras.launching import DEFAULT_STALL_TIMEOUT, env_seconds

EXIT_USAGE = 2
# DEFAULT_STALL_TIMEOUT: the workers' background threads exchange messages every few milliseconds
# whatever training does, so it measures whether a process is alive, not how long a step takes: a slow
# first step does not trip it.
DEFAULT_MASTER_PORT = 29500
_HOST = re.compile(r"^[A-Za-z0-9_.\-\[\]:]*[A-Za-z0-9_.\-\]]:(\d+)$")


class UsageError(ValueError):
    """A bad command line: reported with exit code 2 before anything is started."""


def add_wrap_options(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m hvdkeras` (also accepted, and forwarded, by `hvdkeras run`).

    Defaults are None so that HVDKERAS_* environment variables apply where a flag is not given.
    """
    group = parser.add_argument_group("training options (also as HVDKERAS_<NAME> environment variables)")
    group.add_argument("--lr-scaling", choices=["linear", "sqrt", "none"], default=None,
                       help="scale the script's learning rate with the number of workers (default: linear)")
    group.add_argument("--warmup-epochs", type=float, default=None,
                       help="warm the scaled learning rate up over this many epochs (default: 1; 0 turns it off)")
    group.add_argument("--fp16-allreduce", action="store_const", const=True, default=None,
                       help="send gradients as float16")
    group.add_argument("--backward-passes-per-step", type=int, default=None,
                       help="accumulate gradients locally over K batches per allreduce (default: 1)")
    group.add_argument("--no-shard", action="store_const", const=True, default=None,
                       help="do not shard fit/evaluate data (for scripts that shard themselves)")
    group.add_argument("--report-dir", default=None,
                       help="each worker writes a JSON summary (steps per fit, weights digest) here")


_WRAP_FLAGS = ("lr_scaling", "warmup_epochs", "fp16_allreduce", "backward_passes_per_step", "no_shard", "report_dir")


def wrap_flags(ns: argparse.Namespace) -> list[str]:
    """The training options that were given, as command-line flags again (to forward to each worker)."""
    out: list[str] = []
    for name in _WRAP_FLAGS:
        value = getattr(ns, name, None)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        else:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


@dataclasses.dataclass(frozen=True)
class RunConfig:
    np: int
    hosts: str
    script: str
    script_args: tuple[str, ...]
    forwarded: tuple[str, ...]
    controller: str
    python: str
    horovodrun: str
    min_np: int | None = None
    max_np: int | None = None
    host_discovery_script: str | None = None
    stall_timeout: float = 60.0
    # The ssh-less multi-node form (started once on every node); nnodes is None for horovodrun runs.
    nnodes: int | None = None
    node_rank: int = 0
    nproc_per_node: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    job_id: str | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hvdkeras", description="Data-parallel Keras 3 training with Horovod.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a Keras script on N workers (horovodrun)")
    run.add_argument("-np", "--num-proc", dest="np", type=int, default=None,
                     help="number of workers in all (with --nnodes: optional, nnodes x nproc-per-node)")
    run.add_argument("-H", "--hosts", default=None, help="host1:slots,host2:slots (default: localhost:N)")
    ctrl = run.add_mutually_exclusive_group()
    ctrl.add_argument("--gloo", dest="controller", action="store_const", const="gloo",
                      help="use Gloo (the default)")
    ctrl.add_argument("--mpi", dest="controller", action="store_const", const="mpi", help="use MPI")
    run.add_argument("--min-np", type=int, default=None, help="elastic: fewest workers to keep training")
    run.add_argument("--max-np", type=int, default=None, help="elastic: most workers")
    run.add_argument("--host-discovery-script", default=None, help="elastic: prints host:slots lines")
    run.add_argument("--stall-timeout", type=float, default=None,
                     help="seconds a worker may stop answering before the job fails "
                          f"(default {DEFAULT_STALL_TIMEOUT:g}, or HVDKERAS_STALL_TIMEOUT)")
    nodes = run.add_argument_group(
        "ssh-less multi-node (torchrun / Kubernetes style): start the same command once on every node")
    nodes.add_argument("--nnodes", type=int, default=None, help="number of nodes in the job")
    nodes.add_argument("--node-rank", type=int, default=None, help="this node's index in [0, nnodes)")
    nodes.add_argument("--nproc-per-node", type=int, default=None, help="workers on each node (default 1)")
    nodes.add_argument("--master-addr", default=None,
                       help="host name or address of node 0, where rank 0 hosts the rendezvous")
    nodes.add_argument("--master-port", type=int, default=None,
                       help=f"the rendezvous port on node 0 (default {DEFAULT_MASTER_PORT})")
    nodes.add_argument("--job-id", default=None,
                       help="the same on every node; a worker of another job is never admitted")
    add_wrap_options(run)
    run.add_argument("script", help="the Keras training script")
    run.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    check = sub.add_parser("check", help="print versions and build, run a real 2-process allreduce")
    check.add_argument("--timeout", type=float, default=180.0, help="seconds for the 2-process test")
    return parser


def _find_horovodrun(which: Callable[[str], str | None], python: str = sys.executable) -> str | None:
    beside = os.path.join(os.path.dirname(python), "horovodrun")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return which("horovodrun")


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """Parses "host1:2,host2:4". Raises UsageError on anything else."""
    out = []
    for item in hosts.split(","):
        match = _HOST.match(item.strip())
        if not match or int(match.group(1)) < 1:
            raise UsageError(
                "-H must be a comma-separated list of host:slots with slots >= 1, for example "
                f"'node1:2,node2:2'. Received: -H {hosts!r}"
            )
        host, slots = item.strip().rsplit(":", 1)
        out.append((host, int(slots)))
    return out


def validate(ns: argparse.Namespace, *, which: Callable[[str], str | None] = shutil.which,
             isfile: Callable[[str], bool] = os.path.isfile, python: str = sys.executable) -> RunConfig:
    """Checks a parsed `run` command line; raises UsageError with what was received and what is expected."""
    nodes = _validate_nodes(ns)
    if ns.np is None and nodes is None:
        raise UsageError("-np is required (the number of workers), or --nnodes for the ssh-less multi-node form. "
                         "Received: no -np")
    if ns.np is not None and ns.np < 1:
        raise UsageError(f"-np must be an integer >= 1. Received: -np {ns.np}")
    if not isfile(ns.script):
        raise UsageError(f"the training script does not exist. Received: script={ns.script!r}")
    elastic = ns.min_np is not None or ns.max_np is not None or ns.host_discovery_script is not None
    if nodes is not None and ns.hosts is not None:
        raise UsageError(f"--nnodes starts the workers of this node itself: it takes no -H. Received: -H {ns.hosts!r}")
    if nodes is not None and elastic:
        raise UsageError("--nnodes takes no elastic options. Received: --min-np/--max-np/--host-discovery-script")
    if ns.hosts is not None:
        slots = sum(n for _, n in parse_hosts(ns.hosts))
        if slots < ns.np and not elastic:
            raise UsageError(f"-H offers {slots} slots for -np {ns.np} workers. Received: -H {ns.hosts!r}")
        hosts = ns.hosts
    else:
        hosts = f"localhost:{ns.np}"
    if elastic:
        if ns.host_discovery_script is None or not isfile(ns.host_discovery_script):
            raise UsageError(
                "elastic runs (--min-np/--max-np) need an existing --host-discovery-script. "
                f"Received: --host-discovery-script={ns.host_discovery_script!r}"
            )
        if ns.min_np is not None and not 1 <= ns.min_np <= ns.np:
            raise UsageError(f"--min-np must be in [1, -np]. Received: --min-np {ns.min_np} with -np {ns.np}")
        if ns.max_np is not None and ns.max_np < ns.np:
            raise UsageError(f"--max-np must be >= -np. Received: --max-np {ns.max_np} with -np {ns.np}")
    if ns.backward_passes_per_step is not None and ns.backward_passes_per_step < 1:
        raise UsageError(
            "--backward-passes-per-step must be >= 1. "
            f"Received: --backward-passes-per-step {ns.backward_passes_per_step}"
        )
    if ns.warmup_epochs is not None and ns.warmup_epochs < 0:
        raise UsageError(f"--warmup-epochs must be >= 0. Received: --warmup-epochs {ns.warmup_epochs:g}")
    stall = ns.stall_timeout
    if stall is None:
        try:
            stall = env_seconds(os.environ, "HVDKERAS_STALL_TIMEOUT", DEFAULT_STALL_TIMEOUT)
        except ValueError as err:
            raise UsageError(str(err)) from None
    if not stall > 0:
        raise UsageError(f"--stall-timeout must be > 0 seconds. Received: --stall-timeout {stall:g}")
    if nodes is not None:
        return RunConfig(
            np=nodes["nnodes"] * nodes["nproc_per_node"], hosts="", script=ns.script, script_args=tuple(ns.script_args),
            forwarded=tuple(wrap_flags(ns)), controller="gloo", python=python, horovodrun="", stall_timeout=stall,
            **nodes)
    horovodrun = _find_horovodrun(which, python)
    if horovodrun is None:
        raise UsageError("horovodrun was not found beside this Python or on PATH; install Horovod (make install)")
    return RunConfig(
        np=ns.np, hosts=hosts, script=ns.script, script_args=tuple(ns.script_args), forwarded=tuple(wrap_flags(ns)),
        controller=ns.controller or "gloo", python=python, horovodrun=horovodrun,
        min_np=ns.min_np, max_np=ns.max_np, host_discovery_script=ns.host_discovery_script, stall_timeout=stall,
    )


def _validate_nodes(ns: argparse.Namespace) -> dict | None:
    """The ssh-less multi-node options as RunConfig fields, or None when --nnodes is not given."""
    given = [f"--{n.replace('_', '-')}" for n in ("node_rank", "nproc_per_node", "master_addr", "master_port",
                                                    "job_id") if getattr(ns, n, None) is not None]
    if ns.nnodes is None:
        if given:
            raise UsageError(f"{', '.join(given)} belong to the multi-node form and need --nnodes. Received: "
                             f"{' '.join(given)} without --nnodes")
        return None
    if ns.nnodes < 1:
        raise UsageError(f"--nnodes must be an integer >= 1. Received: --nnodes {ns.nnodes}")
    node_rank = 0 if ns.node_rank is None else ns.node_rank
    if not 0 <= node_rank < ns.nnodes:
        raise UsageError(f"--node-rank must be in [0, --nnodes) = [0, {ns.nnodes}). Received: --node-rank {node_rank}")
    if ns.nnodes > 1 and ns.node_rank is None:
        raise UsageError(f"--node-rank is required with --nnodes {ns.nnodes} (this node's index). Received: none")
    per_node = 1 if ns.nproc_per_node is None else ns.nproc_per_node
    if per_node < 1:
        raise UsageError(f"--nproc-per-node must be an integer >= 1. Received: --nproc-per-node {per_node}")
    if ns.np is not None and ns.np != ns.nnodes * per_node:
        raise UsageError(f"-np must equal --nnodes x --nproc-per-node = {ns.nnodes * per_node}. "
                         f"Received: -np {ns.np} with --nnodes {ns.nnodes} --nproc-per-node {per_node}")
    if ns.nnodes > 1 and not ns.master_addr:
        raise UsageError("--master-addr is required with several nodes: node 0's host name or address, the same "
                         f"on every node. Received: --nnodes {ns.nnodes} without --master-addr")
    port = DEFAULT_MASTER_PORT if ns.master_port is None else ns.master_port
    if not 1 <= port <= 65535:
        raise UsageError(f"--master-port must be a TCP port in [1, 65535]. Received: --master-port {port}")
    return {"nnodes": ns.nnodes, "node_rank": node_rank, "nproc_per_node": per_node,
            "master_addr": ns.master_addr or "127.0.0.1", "master_port": port, "job_id": ns.job_id}


def build_node_workers(config: RunConfig) -> list[tuple[list[str], dict[str, str]]]:
    """The ssh-less multi-node form: (argv, extra env) of each worker this node starts. Pure: no I/O.

    Every worker gets the torchrun / Kubernetes variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT), from which `hvdkeras.init()` forms the job with the other nodes.
    """
    assert config.nnodes is not None
    argv = [config.python, "-m", "hvdkeras", *config.forwarded, config.script, *config.script_args]
    workers = []
    for local_rank in range(config.nproc_per_node):
        env = {
            "RANK": str(config.node_rank * config.nproc_per_node + local_rank),
            "WORLD_SIZE": str(config.np),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
            "MASTER_ADDR": config.master_addr,
            "MASTER_PORT": str(config.master_port),
            "PYTHONUNBUFFERED": "1",
            "HVDKERAS_STALL_TIMEOUT": f"{config.stall_timeout:g}",
        }
        if config.job_id is not None:
            env["HVDKERAS_JOB_ID"] = config.job_id
        workers.append((argv, env))
    return workers


def build_command(config: RunConfig) -> tuple[list[str], dict[str, str]]:
    """The horovodrun command line and extra environment for a run. Pure: no I/O."""
    argv = [config.horovodrun, "-np", str(config.np)]
    if config.host_discovery_script is not None:
        if config.min_np is not None:
            argv += ["--min-np", str(config.min_np)]
        if config.max_np is not None:
            argv += ["--max-np", str(config.max_np)]
        argv += ["--host-discovery-script", config.host_discovery_script]
    else:
        argv += ["-H", config.hosts]
    argv.append("--gloo" if config.controller == "gloo" else "--mpi")
    argv += [config.python, "-m", "hvdkeras", *config.forwarded, config.script, *config.script_args]
    return argv, {"PYTHONUNBUFFERED": "1", "HOROVOD_GLOO_TIMEOUT_SECONDS": f"{config.stall_timeout:g}"}


CHECK_WORKER = textwrap.dedent(
    """
    import hvdkeras as hvd
    hvd.init()
    value = [0.2, -0.1, 0.5] if hvd.rank() == 0 else [0.4, 0.0, 0.3]
    got = [round(float(v), 6) for v in hvd.allreduce(value).numpy()]
    assert hvd.size() == 2, hvd.size()
    assert got == [0.3, -0.05, 0.4], got
    print("allreduce ok", got, flush=True)
    """
)


def check(timeout: float = 180.0, out=print) -> int:
    """Prints versions, Horovod's build and the GPUs, then runs a real 2-process allreduce. 0 on PASS."""
    try:
        import keras
        import tensorflow as tf

        from hvdkeras import _collectives

        out(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, Horovod {_collectives.version()}")
        info = _collectives.build_info()
        out("Horovod controllers: Gloo [%s], MPI [%s]" % ("X" if info["gloo"] else " ", "X" if info["mpi"] else " "))
        out("Horovod tensor operations: Gloo [%s], MPI [%s], NCCL [%s]"
            % ("X" if info["gloo"] else " ", "X" if info["mpi"] else " ", "X" if info["nccl"] else " "))
        gpus = tf.config.list_physical_devices("GPU")
        out(f"GPUs visible: {len(gpus)}" + (" (" + ", ".join(g.name for g in gpus) + ")" if gpus else ""))
        horovodrun = _find_horovodrun(shutil.which)
        if horovodrun is None:
            out("FAIL: horovodrun not found")
            return 1
        cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-c", CHECK_WORKER]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        out(f"FAIL: the 2-process allreduce did not finish within {timeout:g} s")
        return 1
    except Exception as err:  # report, do not crash: this is a diagnostic
        out(f"FAIL: {type(err).__name__}: {err}")
        return 1
    if proc.returncode != 0 or "allreduce ok" not in proc.stdout:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        out("FAIL: 2-process allreduce exited with %d: %s" % (proc.returncode, " | ".join(tail)))
        return 1
    out("PASS: 2-process Gloo allreduce of [0.2, -0.1, 0.5] and [0.4, 0.0, 0.3] gave [0.3, -0.05, 0.4]")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "check":
        return check(ns.timeout)
    try:
        config = validate(ns)
    except UsageError as err:
        print(f"hvdkeras run: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if config.nnodes is not None:
        return supervise(build_node_workers(config))
    cmd, extra_env = build_command(config)
    env = dict(os.environ, **extra_env)
    # In elastic runs horovodrun numbers processes by slot, not by rank: do not name ranks from its output.
    return stream(cmd, env, name_failed_rank=config.host_discovery_script is None)


_FAILED = re.compile(rb"^Process (\d+) exit with status code (-?\d+)")


# What a worker prints when it fails only because another one did (its collectives were torn down).
_COLLATERAL = (b"Horovod has been shut down", b"Connection reset by peer", b"Connection closed by peer",
               b"Timed out waiting")
_RANK_LINE = re.compile(rb"^\[(\d+)\]<std(?:out|err)>:")
_TRACEBACK = b"Traceback (most recent call last)"


class FailureTracker:
    """Finds the rank that failed first from horovodrun's output.

    horovodrun reports exits in the order it notices them, and a survivor whose allreduce was torn down can
    exit before the worker that caused it is noticed; horovodrun then terminates the cause, which never
    reports an exit of its own. So ranks whose output shows such a collateral failure only count when no
    other rank failed, and a rank that printed a traceback of its own counts even when it never exited.
    """

    def __init__(self):
        self.exits: list[tuple[int, int]] = []
        self.collateral: set[int] = set()
        self.raised: list[int] = []

    def feed(self, line: bytes) -> None:
        rank_line = _RANK_LINE.match(line)
        if rank_line:
            rank = int(rank_line.group(1))
            if any(marker in line for marker in _COLLATERAL):
                self.collateral.add(rank)
            elif _TRACEBACK in line and rank not in self.raised:
                self.raised.append(rank)
        exited = _FAILED.match(line.strip())
        if exited and int(exited.group(2)) != 0:
            self.exits.append((int(exited.group(1)), int(exited.group(2))))

    def first_failure(self) -> tuple[int, int | None] | None:
        """(rank, exit code) of the failure that started it, or None if horovodrun reported none. The exit
        code is None for a rank that raised and was terminated before horovodrun saw it exit."""
        for rank, code in self.exits:
            if rank not in self.collateral:
                return rank, code
        for rank in self.raised:
            if rank not in self.collateral:
                return rank, None
        return self.exits[0] if self.exits else None


class StallWatch:
    """Watches the local worker processes of a job; remembers the ranks whose process was stopped.

    When a worker stops answering, the others fail with a Gloo timeout that cannot say whom they waited
    for; on this host the process table can (a SIGSTOPped or suspended process is in state "stopped").
    """

    def __init__(self, pid: int, interval: float = 0.5):
        import threading

        self.pid = pid
        self.interval = interval
        self.stopped: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._done.wait(self.interval):
            try:
                children = root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            for child in children:
                try:
                    if child.status() == psutil.STATUS_STOPPED:
                        rank = child.environ().get("HOROVOD_RANK")
                        if rank is not None:
                            self.stopped.add(int(rank))
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)


def stream(cmd: list[str], env: dict, name_failed_rank: bool = True) -> int:
    """Runs horovodrun, passing its rank-prefixed output through; on failure names the rank that failed first
    (or the rank that stopped answering)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    watch = StallWatch(proc.pid)
    failures = FailureTracker()
    out = sys.stdout.buffer
    try:
        for line in iter(proc.stdout.readline, b""):
            out.write(line)
            out.flush()
            if name_failed_rank:
                failures.feed(line)
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        code = proc.wait()
    finally:
        watch.close()
    if code != 0:
        if watch.stopped:
            ranks = ", ".join(str(r) for r in sorted(watch.stopped))
            print(f"hvdkeras run: the job failed: rank {ranks} stopped answering (its process was stopped); the "
                  f"others gave up after waiting {env.get('HOROVOD_GLOO_TIMEOUT_SECONDS', '?')} s "
                  "(--stall-timeout).", file=sys.stderr, flush=True)
        elif failures.first_failure() is not None:
            rank, worker_code = failures.first_failure()
            if worker_code is None:
                how = "it raised; its traceback is above"
            elif worker_code < 0:
                how = f"killed by signal {-worker_code}"
            else:
                how = f"exit code {worker_code}"
            print(f"hvdkeras run: the job failed: rank {rank} failed first ({how}); the other workers were stopped.",
                  file=sys.stderr, flush=True)
        else:
            print(f"hvdkeras run: the job failed (horovodrun exit code {code}).", file=sys.stderr, flush=True)
    return code


def supervise(workers: list[tuple[list[str], dict[str, str]]], grace: float = 5.0) -> int:
    """Runs this node's workers with rank-prefixed output, as horovodrun prints it; returns the job's exit code.

    When a worker fails, the others on this node are stopped (SIGTERM, then SIGKILL after `grace` seconds)
    and the rank that failed first is named; the other nodes' workers fail on their own when their
    collectives lose this node (within the stall timeout).
    """
    import signal
    import threading

    out = sys.stdout.buffer
    lock = threading.Lock()
    procs: dict[int, subprocess.Popen] = {}

    def pump(rank: int, stream_name: str, pipe) -> None:
        prefix = f"[{rank}]<{stream_name}>:".encode()
        for line in iter(pipe.readline, b""):
            with lock:
                out.write(prefix + line)
                out.flush()

    def signal_all(sig: int) -> None:
        for proc in procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass

    pumps = []
    for argv, extra in workers:
        rank = int(extra["RANK"])
        proc = subprocess.Popen(argv, env=dict(os.environ, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        procs[rank] = proc
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            thread = threading.Thread(target=pump, args=(rank, name, pipe), daemon=True)
            thread.start()
            pumps.append(thread)
    first: tuple[int, int] | None = None
    try:
        while any(p.poll() is None for p in procs.values()):
            for rank, proc in procs.items():
                code = proc.poll()
                if code not in (None, 0) and first is None:
                    first = (rank, code)
                    signal_all(signal.SIGTERM)
                    deadline = time.monotonic() + grace
                    while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
                        time.sleep(0.1)
                    signal_all(signal.SIGKILL)
            time.sleep(0.1)
    except KeyboardInterrupt:
        signal_all(signal.SIGTERM)
        time.sleep(grace)
        signal_all(signal.SIGKILL)
        return 130
    finally:
        for proc in procs.values():
            proc.wait()
        for thread in pumps:
            thread.join(timeout=5)
    if first is None:
        failed = [(r, p.returncode) for r, p in sorted(procs.items()) if p.returncode != 0]
        first = failed[0] if failed else None
    if first is None:
        return 0
    rank, code = first
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    print(f"hvdkeras run: the job failed: rank {rank} failed first on this node ({how}); this node's other "
          "workers were stopped.", file=sys.stderr, flush=True)
    return code if code > 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
