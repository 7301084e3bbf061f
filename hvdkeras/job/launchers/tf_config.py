"""TF_CONFIG: Kubeflow's TFJob, Ray Train's TensorflowTrainer and tf.distribute's platforms."""

from __future__ import annotations

import hashlib
import json

from hvdkeras.job.launchers.env import LaunchEnvError, finish

TF_CONFIG_TASKS = ("chief", "worker")  # the task types that train, in rank order


def split_address(address: str) -> tuple[str, str]:
    """("host", "port") of "host:port" ("[::1]:80" gives "::1"); the port is "" when there is none."""
    host, _, port = address.strip().rpartition(":")
    return (host.strip("[]"), port) if host else (address.strip().strip("[]"), "")


def read_tf_config(environ):
    """TF_CONFIG, as Kubeflow's TFJob, Ray Train's TensorflowTrainer and tf.distribute's platforms set it:
    `{"cluster": {"chief": ["h0:p"], "worker": ["h1:p", "h2:p"]}, "task": {"type": "worker", "index": 0}}`.

    Ranks: the chief first, then the workers in index order. Rank 0's host is the first of those addresses.
    The rendezvous port is not one of the cluster's own ports (a TensorFlow server of the same job may bind
    those): unless MASTER_PORT or HVDKERAS_RENDEZVOUS_PORT says otherwise, every process derives it from the
    cluster spec (`derived_port`), skipping any port the spec lists. Local ranks come from the hosts.
    """
    raw = environ["TF_CONFIG"]
    try:
        config = json.loads(raw)
    except ValueError as err:
        raise LaunchEnvError(f"TF_CONFIG must be JSON with a 'cluster' and a 'task'. Received: TF_CONFIG={raw!r} "
                             f"({err})") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise LaunchEnvError(f"TF_CONFIG must be a JSON object with a 'cluster' and a 'task'. Received: "
                             f"TF_CONFIG={raw!r}")
    kind, index = task.get("type"), task.get("index", 0)
    if cluster.get("ps"):
        raise LaunchEnvError(
            f"TF_CONFIG describes a parameter-server job (its cluster has 'ps' tasks): hvdkeras trains data-"
            f"parallel with 'chief' and 'worker' tasks only. Received: task {kind}:{index} in TF_CONFIG={raw!r}")
    if kind not in TF_CONFIG_TASKS:
        raise LaunchEnvError(
            f"TF_CONFIG's task {kind!r} does not train: hvdkeras forms its job from the 'chief' and 'worker' tasks "
            f"(run an evaluator as a job of its own, without TF_CONFIG). Received: task {kind}:{index} in "
            f"TF_CONFIG={raw!r}")
    addresses = []
    for name in TF_CONFIG_TASKS:
        listed = cluster.get(name) or []
        if isinstance(listed, dict):  # sparse form {"0": "host:port"}
            listed = [listed[k] for k in sorted(listed, key=int)]
        if not isinstance(listed, list) or not all(isinstance(a, str) and a.strip() for a in listed):
            raise LaunchEnvError(f"TF_CONFIG's cluster['{name}'] must be a list of 'host:port' strings. Received: "
                                 f"TF_CONFIG={raw!r}")
        addresses.append(listed)
    chiefs, workers = addresses
    count = len(chiefs) if kind == "chief" else len(workers)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise LaunchEnvError(
            f"TF_CONFIG's task index must be in [0, {count}), the number of '{kind}' tasks in its cluster. "
            f"Received: task {kind}:{index!r} in TF_CONFIG={raw!r}")
    ordered = chiefs + workers
    size = len(ordered)
    rank = index if kind == "chief" else len(chiefs) + index
    hosts = [split_address(a)[0] for a in ordered]
    local_rank, local_size = hosts[:rank].count(hosts[rank]), hosts.count(hosts[rank])
    job = "tfconfig-" + hashlib.sha256(json.dumps(ordered).encode()).hexdigest()[:16]
    listed = [a for tasks in cluster.values() for a in (tasks.values() if isinstance(tasks, dict) else tasks)]
    cluster_ports = {int(p) for p in (split_address(str(a))[1] for a in listed) if p.isdigit()}
    return finish(environ, launcher="TF_CONFIG", names=("TF_CONFIG",), rank=rank, size=size,
                   local_rank=local_rank, local_size=local_size, launcher_job=job,
                   launcher_host=(hosts[0], "TF_CONFIG"), avoid_ports=cluster_ports)
