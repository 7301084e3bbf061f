"""Ray Train's own TensorflowTrainer with hvdkeras, on a real Ray cluster across the two test hosts.

One cluster for the module: `ray start --head` in hosta, `ray start --address` in hostb, one CPU each (so
one Train worker per host). One driver (workers/ray_driver.py) runs the training, restart and elastic
scenarios in turn; during the elastic one, the fixture takes hostb's node away and brings it back. The
example runs on the same cluster.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from jobcheck import check_two_workers

from launch import REPO, WORKERS, Job, base_env, dump_and_kill, kill_tree, run_command

pytest.importorskip("ray", reason="the ray extra is not installed (make install installs it)")
DRIVER = WORKERS / "ray_driver.py"
RAY = str(Path(sys.executable).parent / "ray")
PORT = 6379
# No token (Ray 2.52+ asks for one by default; the cluster is reachable only inside the test hosts), every
# line of every worker on the driver (Ray folds repeated lines by default), GCS notices a lost node in ~3 s.
# Train V2 sizes a restart from Ray Data's AutoscalingCoordinator, whose view of the nodes is refreshed only
# every 20 s: just after a node is lost it still counts that node, and the attempt to start the old number
# of workers waits for the worker-group start timeout (60 s by default) before it retries with fewer.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0",
           "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
           "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "20",
           # Watches for cloud preemption notices, of which the test hosts have none: one actor less per run.
           "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
ELASTIC_EPOCHS = 8  # workers/ray_driver.py's elastic run
WORKER_LINE = re.compile(r"^(?:\x1b\[\d+m)?\(RayTrainWorker pid=(\d+)[^)]*\)(?:\x1b\[0m)? ?")


class RayCluster:
    """A Ray head node in hosta and a worker node in hostb, each started by `ray start --block`."""

    def __init__(self, hosts, root: Path):
        self.hosts = hosts
        self.root = root
        self.temp = Path(tempfile.mkdtemp(prefix="hvdk-ray-"))  # short: Ray's sockets live under it
        self.address = f"{hosts.addr[hosts.NAMES[0]]}:{PORT}"
        self.nodes: dict[str, subprocess.Popen] = {}

    def env(self) -> dict:
        """The tests' worker environment (one thread each, small buckets): Train workers inherit the node's."""
        return base_env(self.root, RAY_ENV)

    def start_node(self, host: str) -> None:
        head = host == self.hosts.NAMES[0]
        role = ["--head", "--port", str(PORT), "--include-dashboard=false", "--disable-usage-stats"] if head \
            else ["--address", self.address]
        cmd = self.hosts.ns(host, RAY, "start", *role, "--node-ip-address", self.hosts.addr[host], "--num-cpus", "1",
                            "--temp-dir", str(self.temp / host), "--block")
        with open(self.root / f"ray-{host}.log", "ab") as log:
            self.nodes[host] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                                start_new_session=True)

    def stop_node(self, host: str) -> None:
        """The node's raylet and every process on it (its Train worker too), killed at once: a lost host."""
        proc = self.nodes.pop(host)
        kill_tree(proc.pid)
        proc.wait(30)

    def logs(self) -> str:
        logs = sorted(self.root.glob("*.log"))
        return "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}\n" for p in logs)

    def stop(self) -> None:
        for host in list(self.nodes):
            self.stop_node(host)
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_cluster(hosts, tmp_path_factory):
    cluster = RayCluster(hosts, tmp_path_factory.mktemp("ray_cluster"))
    try:
        for host in hosts.NAMES:
            cluster.start_node(host)
        yield cluster
    finally:
        cluster.stop()
    time.sleep(1)
    assert hosts.processes() == {"hosta": [], "hostb": []}


@pytest.fixture(scope="module")
def ray_jobs(ray_cluster, tmp_path_factory):
    """One driver for the three scenarios; while it runs the elastic one, hostb's node goes away and back."""
    out = tmp_path_factory.mktemp("ray_jobs")
    a, b = ray_cluster.hosts.NAMES
    log = open(out / "driver.log", "w")
    driver = subprocess.Popen(ray_cluster.hosts.ns(a, sys.executable, str(DRIVER), ray_cluster.address, str(out),
                                                   "train", "restart", "elastic"),
                              stdout=log, stderr=subprocess.STDOUT, env=base_env(out, RAY_ENV), start_new_session=True)
    folder, hold = out / "elastic" / "attempts", out / "elastic" / "hold"
    snapshot = out / "storage" / "elastic" / "checkpoint_manager_snapshot.json"
    times = {}
    try:
        waiting = Waiting(driver, out / "driver.log", folder)
        waiting.until(lambda g: g[-1][0]["size"] == 2 and _registered(snapshot) >= 2,
                      "Ray to register the elastic run's checkpoints of 2 epochs", timeout=400)
        hold.touch()  # the one-worker attempt waits at its epoch ends until the job has grown again
        ray_cluster.stop_node(b)
        times["lost"] = time.time()
        waiting.until(lambda g: g[-1][0]["size"] == 1 and g[-1][0]["epochs_done"], "one worker to train an epoch")
        ray_cluster.start_node(b)
        times["back"] = time.time()
        waiting.until(lambda g: g[-1][0]["size"] == 2 and g[-1][0]["began"] > times["back"],
                      "the job to grow back to two workers")
        hold.unlink()
        driver.wait(300)
    finally:
        if driver.poll() is None:
            dump_and_kill(driver.pid)
        log.close()
        if b not in ray_cluster.nodes:
            ray_cluster.start_node(b)
    output = (out / "driver.log").read_text(errors="replace")
    job = Job(returncode=driver.returncode, output=output)
    if job.returncode != 0 or not (out / "ray.json").exists():
        job.fail(f"the Ray driver exited {job.returncode}\n{ray_cluster.logs()}")
    job.out, job.times = out, times
    job.scenarios = json.loads((out / "ray.json").read_text())
    return job


def _registered(snapshot: Path) -> int:
    """How many checkpoints Ray's controller has registered (it takes a report at its next poll, every 2 s)."""
    try:
        return len(json.loads(snapshot.read_text())["checkpoint_results"])
    except (OSError, ValueError):
        return 0


class Waiting:
    """Polls the attempts a running driver's workers write, failing with its output if it ends or stalls."""

    def __init__(self, driver: subprocess.Popen, log: Path, folder: Path):
        self.driver, self.log, self.folder = driver, log, folder

    def until(self, ready, what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.driver.poll() is not None:
                raise AssertionError(f"the driver exited {self.driver.returncode} while waiting for {what}\n"
                                     f"{self.log.read_text(errors='replace')[-6000:]}")
            groups = attempts(self.folder) if self.folder.exists() else []
            if groups and ready(groups):
                return
            time.sleep(0.3)
        raise AssertionError(f"no {what} within {timeout:g} s\n{self.log.read_text(errors='replace')[-6000:]}")


def lines_by_pid_rank(output: str, pids: dict[int, int]) -> dict[int, list[str]]:
    """Each Train worker's lines ("(RayTrainWorker pid=N, ip=...) text"), by the rank of that pid."""
    out: dict[int, list[str]] = {}
    for line in output.splitlines():
        match = WORKER_LINE.match(line)
        if match and int(match.group(1)) in pids:
            out.setdefault(pids[int(match.group(1))], []).append(line[match.end():])
    return out


def attempts(folder: Path) -> list[list[dict]]:
    """What each attempt's workers wrote, grouped by attempt (workers that began within 10 s), in order."""
    states = sorted((json.loads(p.read_text()) for p in folder.glob("*.json")), key=lambda s: s["began"])
    groups: list[list[dict]] = []
    for state in states:
        if groups and state["began"] - groups[-1][0]["began"] < 10 and len(groups[-1]) < state["size"]:
            groups[-1].append(state)
        else:
            groups.append([state])
    return [sorted(g, key=lambda s: s["rank"]) for g in groups]


def test_tensorflow_trainer_forms_one_job(ray_jobs):
    """workers/init_script.py in TensorflowTrainer's loop: one job of 2, one worker in each host."""
    train = ray_jobs.scenarios["train"]
    assert train["error"] is None, train.get("traceback")
    out = ray_jobs.out / "train"
    pids = {int((out / "pids" / f"rank{r}").read_text()): r for r in (0, 1)}
    reports = check_two_workers(out, "init", lines_by_pid_rank(ray_jobs.output, pids))
    assert [reports[r]["cross_size"] for r in (0, 1)] == [2, 2]


def test_a_killed_worker_restarts_and_resumes_from_the_last_checkpoint(ray_jobs):
    restart = ray_jobs.scenarios["restart"]
    assert restart["error"] is None, restart.get("traceback")
    killed = json.loads((ray_jobs.out / "restart" / "killed.json").read_text())
    first, second = attempts(ray_jobs.out / "restart" / "attempts")  # exactly one restart
    assert [s["size"] for s in first + second] == [2, 2, 2, 2]
    assert [s["epochs_done"] for s in first] == [[0, 1], [0, 1]]  # killed inside epoch 2 (0-based)
    assert killed["epoch"] == 2 and killed["pid"] == first[1]["pid"]
    for state in second:
        assert state["resumed"] and state["initial_epoch"] == 2, state
        assert state["resumed_digest"] == first[0]["digests"]["1"]  # the weights of the checkpoint of epoch 2
        assert state["iterations"] == 2 * 23  # the optimizer's state came back too
        assert state["epochs_done"] == [2, 3]
    assert second[0]["digests"]["3"] == second[1]["digests"]["3"]
    assert restart["checkpoint_files"] == ["hvdkeras.json", "model.keras"]
    assert restart["checkpoint_state"] == {"epochs_completed": 4, "size": 2, "event": "epoch_end"}
    assert set(restart["metrics"]) == {"loss", "accuracy"}
    took = min(s["first_batch"] for s in second) - killed["killed"]
    print(f"restart: killed at epoch 3 batch {killed['batch']}; the restarted job's first batch {took:.1f} s later, "
          f"from the checkpoint of epoch 2; final digest {second[0]['digests']['3'][:16]}")


def test_elastic_scaling_config_shrinks_and_grows_with_the_second_host(ray_jobs):
    """ScalingConfig(num_workers=(1, 2)): hostb's node went away in epoch 3 and came back later (ray_jobs)."""
    elastic = ray_jobs.scenarios["elastic"]
    assert elastic["error"] is None, elastic.get("traceback")
    groups = attempts(ray_jobs.out / "elastic" / "attempts")
    assert [len(g) for g in groups] == [2, 1, 2], [[(s["size"], s["epochs_done"]) for s in g] for g in groups]
    before, alone, after = groups
    assert alone[0]["resumed"] and alone[0]["initial_epoch"] >= 2  # from the last checkpoint Ray registered
    assert alone[0]["resumed_digest"] == before[0]["digests"][str(alone[0]["initial_epoch"] - 1)]
    assert alone[0]["learning_rate"] == pytest.approx(before[0]["learning_rate"] / 2)  # rescaled for one worker
    for state in after:
        assert state["resumed"] and state["initial_epoch"] == alone[0]["epochs_done"][-1] + 1
        assert state["resumed_digest"] == alone[0]["digests"][str(state["initial_epoch"] - 1)]
        assert state["epochs_done"][-1] == ELASTIC_EPOCHS - 1
    last = str(ELASTIC_EPOCHS - 1)
    assert after[0]["digests"][last] == after[1]["digests"][last]
    assert elastic["checkpoint_state"] == {"epochs_completed": ELASTIC_EPOCHS, "size": 2, "event": "epoch_end"}
    shrink = alone[0]["first_batch"] - ray_jobs.times["lost"]
    grow = min(s["first_batch"] for s in after) - ray_jobs.times["back"]
    print(f"elastic: epochs {[g[0]['epochs_done'] for g in groups]} at sizes 2, 1, 2; shrank {shrink:.1f} s after "
          f"the node was lost, grew {grow:.1f} s after it came back; final digest {after[0]['digests'][last][:16]}")


def test_ray_digits_example(ray_cluster, tmp_path):
    example = REPO / "examples" / "ray_digits.py"
    job = run_command(ray_cluster.hosts.ns(ray_cluster.hosts.NAMES[0], sys.executable, str(example), "--address",
                                           ray_cluster.address, "--epochs", "2", "--storage-path", str(tmp_path)),
                      tmp_path, timeout=300, env=RAY_ENV)
    if job.returncode != 0:
        job.fail(f"examples/ray_digits.py exited {job.returncode}")
    final = [line for line in job.output.splitlines() if line.startswith("val_accuracy")]
    assert len(final) == 1 and float(final[0].split()[1].rstrip(";")) > 0.8, job.output[-3000:]
    checkpoint = Path(final[0].split("checkpoint ")[1])
    assert sorted(p.name for p in checkpoint.iterdir()) == ["hvdkeras.json", "model.keras"]
    print(final[0])
