"""`hvdkeras run | check`: the command line, parsed and validated; then the pure command, then supervision.

    hvdkeras run -np 2 [-H host1:2,host2:2] [--lr-scaling linear] [...] train.py [script args]
    hvdkeras run --nnodes 2 --node-rank I --master-addr node0 [--nproc-per-node 1] train.py   (on every node)
    hvdkeras check

This module is the parser and the validation (`build_parser`, `validate` -> a RunConfig) and `main`; the
command is built by `hvdkeras.cli.command`, run by `hvdkeras.cli.supervise`; `check` is `hvdkeras.cli.check`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from typing import Callable, Sequence

from hvdkeras import settings
from hvdkeras.cli.command import (
    DEFAULT_COOLDOWN_RANGE,
    DEFAULT_MASTER_PORT,
    MAX_COOLDOWN,
    RunConfig,
    build_command,
    build_node_workers,
    find_horovodrun,
)
from hvdkeras.cli.supervise import stream, supervise
from hvdkeras.job import auth
from hvdkeras.settings import DEFAULT_STALL_TIMEOUT

EXIT_USAGE = 2
_HOST = re.compile(r"^[A-Za-z0-9_.\-\[\]:]*[A-Za-z0-9_.\-\]]:(\d+)$")


class UsageError(ValueError):
    """A bad command line: reported with exit code 2 before anything is started."""


def add_wrap_options(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m hvdkeras` (also accepted, and forwarded, by `hvdkeras run`): one flag per
    training setting (`hvdkeras.settings.training_settings`), `--name-with-dashes`.

    Defaults are None so that HVDKERAS_* environment variables apply where a flag is not given.
    """
    group = parser.add_argument_group("training options (also as HVDKERAS_<NAME> environment variables)")
    for field in settings.training_settings():
        meta, flag = field.metadata, "--" + field.name.replace("_", "-")
        if meta["kind"] == "bool":
            group.add_argument(flag, action="store_const", const=True, default=None, help=meta["doc"])
        elif meta["kind"] == "choice":
            group.add_argument(flag, choices=list(meta["choices"]), default=None, help=meta["doc"])
        else:
            kind = {"int": int, "number": float}.get(meta["kind"], str)
            group.add_argument(flag, type=kind, default=None, help=meta["doc"])


WRAP_FLAGS = tuple(field.name for field in settings.training_settings())


def wrap_flags(ns: argparse.Namespace) -> list[str]:
    """The training options that were given, as command-line flags again (to forward to each worker)."""
    out: list[str] = []
    for name in WRAP_FLAGS:
        value = getattr(ns, name, None)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        else:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations: the script's own options follow, and one that abbreviates two of ours would be refused.
    parser = argparse.ArgumentParser(prog="hvdkeras", description="Data-parallel Keras 3 training with Horovod.",
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a Keras script on N workers (horovodrun)", allow_abbrev=False)
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
    run.add_argument("--blacklist-cooldown-range", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                     help="elastic: seconds a host whose worker failed stays out before it may rejoin, doubling "
                          "at each failure from MIN up to MAX (default "
                          f"{' '.join(map(str, DEFAULT_COOLDOWN_RANGE))}; horovodrun's own default keeps it out)")
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


def build_worker_parser() -> argparse.ArgumentParser:
    """`python -m hvdkeras [options] [--] script [script options]`: one worker (what `hvdkeras run` starts)."""
    parser = argparse.ArgumentParser(
        prog="python -m hvdkeras",
        description="Run an unmodified Keras 3 training script as one worker of a data-parallel job.",
        allow_abbrev=False,  # the script's options follow: one that abbreviates two of ours is the script's
    )
    add_wrap_options(parser)
    parser.add_argument("script", help="the Keras training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


MAX_WORKERS = 1 << 16  # workers (or nodes, or processes per node) one command may ask for


def _at_least_one(flag: str, value: int) -> int:
    """The command line's form of the package's check_int: argparse already made `value` an int."""
    if value < 1:
        raise UsageError(f"{flag} must be an integer >= 1. Received: {flag} {value}")
    if value > MAX_WORKERS:
        raise UsageError(f"{flag} must be an integer from 1 to {MAX_WORKERS}. Received: {flag} "
                         f"{settings.received(value)}")
    return value


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """Parses "host1:2,host2:4". Raises UsageError on anything else."""
    out = []
    for item in hosts.split(","):
        match = _HOST.match(item.strip())
        if not match or int(match.group(1)) < 1:
            raise UsageError(
                "-H must be a comma-separated list of host:slots with slots >= 1, for example "
                f"'node1:2,node2:2'. Received: -H {settings.received(hosts)}"
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
    if ns.np is not None:
        _at_least_one("-np", ns.np)
    if not isfile(ns.script):
        raise UsageError(f"the training script does not exist. Received: script={settings.received(ns.script)}")
    elastic = (ns.min_np is not None or ns.max_np is not None or ns.host_discovery_script is not None
               or ns.blacklist_cooldown_range is not None)
    if nodes is not None and ns.hosts is not None:
        raise UsageError(f"--nnodes starts the workers of this node itself: it takes no -H. Received: -H {ns.hosts!r}")
    if nodes is not None and elastic:
        raise UsageError("--nnodes takes no elastic options. Received: "
                         "--min-np/--max-np/--host-discovery-script/--blacklist-cooldown-range")
    if ns.hosts is not None:
        slots = sum(n for _, n in parse_hosts(ns.hosts))
        if slots < ns.np and not elastic:
            raise UsageError(f"-H offers {slots} slots for -np {ns.np} workers. Received: -H "
                             f"{settings.received(ns.hosts)}")
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
        if ns.max_np is not None and not ns.np <= ns.max_np <= MAX_WORKERS:
            raise UsageError(f"--max-np must be from -np to {MAX_WORKERS}. Received: --max-np "
                             f"{settings.received(ns.max_np)} with -np {ns.np}")
    cooldown = _cooldown_range(ns.blacklist_cooldown_range) if elastic else None
    for name in WRAP_FLAGS:
        if getattr(ns, name, None) is not None:
            settings.check_value(name, getattr(ns, name), error=UsageError, flag=True)
    try:
        environ = settings.read(os.environ)
    except ValueError as err:
        raise UsageError(str(err)) from None
    settings.check_reducer_with_sharding(environ.reducer if ns.reducer is None else ns.reducer,
                                         bool(ns.shard_optimizer_state or environ.shard_optimizer_state),
                                         error=UsageError)
    stall = environ.stall_timeout if ns.stall_timeout is None else ns.stall_timeout
    settings.check_value("stall_timeout", stall, error=UsageError, flag=True)
    if nodes is not None:
        return RunConfig(
            np=nodes["nnodes"] * nodes["nproc_per_node"], hosts="", script=ns.script, script_args=tuple(ns.script_args),
            forwarded=tuple(wrap_flags(ns)), controller="gloo", python=python, horovodrun="", stall_timeout=stall,
            startup_log=environ.tf_startup_log, **nodes)
    horovodrun = find_horovodrun(which, python)
    if horovodrun is None:
        raise UsageError("horovodrun was not found beside this Python or on PATH; install Horovod (make install)")
    return RunConfig(
        np=ns.np, hosts=hosts, script=ns.script, script_args=tuple(ns.script_args), forwarded=tuple(wrap_flags(ns)),
        controller=ns.controller or "gloo", python=python, horovodrun=horovodrun,
        min_np=ns.min_np, max_np=ns.max_np, host_discovery_script=ns.host_discovery_script, stall_timeout=stall,
        startup_log=environ.tf_startup_log, cooldown_range=cooldown,
    )


def _cooldown_range(given: list[int] | None) -> tuple[int, int]:
    """--blacklist-cooldown-range MIN MAX, checked against horovodrun's bounds (1 s to 1 h), or the default."""
    if given is None:
        return DEFAULT_COOLDOWN_RANGE
    low, high = given
    if not 1 <= low <= high <= MAX_COOLDOWN:
        raise UsageError(f"--blacklist-cooldown-range takes MIN MAX seconds with 1 <= MIN <= MAX <= {MAX_COOLDOWN}. "
                         f"Received: --blacklist-cooldown-range {low} {high}")
    return low, high


def _validate_nodes(ns: argparse.Namespace) -> dict | None:
    """The ssh-less multi-node options as RunConfig fields, or None when --nnodes is not given."""
    given = [f"--{n.replace('_', '-')}" for n in ("node_rank", "nproc_per_node", "master_addr", "master_port",
                                                    "job_id") if getattr(ns, n, None) is not None]
    if ns.nnodes is None:
        if given:
            raise UsageError(f"{', '.join(given)} belong to the multi-node form and need --nnodes. Received: "
                             f"{' '.join(given)} without --nnodes")
        return None
    _at_least_one("--nnodes", ns.nnodes)
    node_rank = 0 if ns.node_rank is None else ns.node_rank
    if not 0 <= node_rank < ns.nnodes:
        raise UsageError(f"--node-rank must be in [0, --nnodes) = [0, {ns.nnodes}). Received: --node-rank {node_rank}")
    if ns.nnodes > 1 and ns.node_rank is None:
        raise UsageError(f"--node-rank is required with --nnodes {ns.nnodes} (this node's index). Received: none")
    per_node = _at_least_one("--nproc-per-node", 1 if ns.nproc_per_node is None else ns.nproc_per_node)
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


def _run_node(config: RunConfig) -> int:
    """This node's workers of the ssh-less form, with the job's secret: the one HVDKERAS_SECRET_FILE names
    (checked first), else, for a job on this node alone, a new one in a private folder removed afterwards. A job
    across nodes without one is told that its rendezvous takes unsigned requests."""
    workers = build_node_workers(config)
    given = settings.read(os.environ).secret_file
    folder = None
    if given:
        try:
            auth.read_secret(given)
        except auth.SecretError as err:
            print(f"hvdkeras run: error: {err}", file=sys.stderr)
            return EXIT_USAGE
    elif config.nnodes > 1:
        print("hvdkeras run: warning: the job's rendezvous takes unsigned requests: anyone who can reach "
              f"{config.master_addr}:{config.master_port} and learns the job id can join it. Give every node the "
              "same secret file, HVDKERAS_SECRET_FILE (docs/security.md).", file=sys.stderr)
    else:
        folder = tempfile.mkdtemp(prefix="hvdkeras-job-")  # mode 700
        path = auth.write_secret(folder)
        for _, env in workers:
            env[settings.variable("secret_file")] = path
    try:
        return supervise(workers, startup_log=config.startup_log)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "check":
        from hvdkeras.cli.check import check

        return check(ns.timeout)
    try:
        config = validate(ns)
    except UsageError as err:
        print(f"hvdkeras run: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if config.nnodes is not None:
        return _run_node(config)
    cmd, extra_env = build_command(config)
    env = dict(os.environ, **extra_env)
    # In elastic runs horovodrun numbers processes by slot, not by rank: do not name ranks from its output.
    return stream(cmd, env, name_failed_rank=config.host_discovery_script is None, startup_log=config.startup_log)


if __name__ == "__main__":
    sys.exit(main())
