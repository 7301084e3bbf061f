"""hvdkeras.spark.run on a real PySpark: local[2], and a standalone master with one worker in each test host.

One driver process (workers/spark_driver.py) per Spark session runs several scenarios; the tests read what
each gave. The training scenario runs workers/init_script.py in the function, with the launcher tests'
checks: equal steps, identical weights, rank-0-only checkpoints and progress.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from jobcheck import check_two_workers, lines_by_rank

from launch import Started, run_command, show

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed (make install installs it)")
DRIVER = Path(__file__).resolve().parent / "workers" / "spark_driver.py"
SPARK_ENV = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
FAILURE_BOUND = 15 + 30  # the failing scenario's stall timeout, plus starting TensorFlow in two processes


@pytest.fixture(scope="module")
def local_spark(tmp_path_factory):
    out = tmp_path_factory.mktemp("spark_local")
    job = run_command([sys.executable, str(DRIVER), "local[2]", str(out), "train", "failing", "too_many",
                       "horovod_spark"], out, timeout=600, env=SPARK_ENV)
    if job.returncode != 0 or not (out / "spark.json").exists():
        job.fail(f"the Spark driver exited {job.returncode}")
    job.out = out
    job.scenarios = json.loads((out / "spark.json").read_text())
    return job


def test_local_spark_forms_one_job(local_spark):
    train = local_spark.scenarios["train"]
    assert train["error"] is None, train.get("traceback")
    assert [(r["rank"], r["size"]) for r in train["value"]] == [(0, 2), (1, 2)]  # fn's results, by rank
    check_two_workers(local_spark.out, "init", lines_by_rank(local_spark.output, "horovodrun"))


def test_a_failing_task_ends_the_job_with_its_error_on_the_driver(local_spark):
    failing = local_spark.scenarios["failing"]
    assert failing["error"].startswith("SparkJobError: rank 1 of 2 failed first")
    assert "ValueError: rank 1 cannot go on" in failing["error"]
    assert failing["seconds"] < FAILURE_BOUND, f"took {failing['seconds']:.1f} s"
    print(f"failing task: the driver raised after {failing['seconds']:.1f} s")


def test_more_processes_than_task_slots_fails_within_the_bound(local_spark):
    too_many = local_spark.scenarios["too_many"]
    assert "asked for 3 processes, but this Spark cluster has 2 task slots" in too_many["error"]
    assert too_many["seconds"] < 5 + 10
    print(f"3 processes on 2 slots: refused after {too_many['seconds']:.1f} s (start_timeout=5)")


def test_horovod_spark_run_itself_runs_an_hvdkeras_function(local_spark):
    """horovod.spark.run starts its own Gloo job (HOROVOD_* variables), which hvdkeras.init() joins."""
    result = local_spark.scenarios["horovod_spark"]
    assert result["error"] is None, result.get("traceback")
    assert result["value"] == [{"rank": 0, "size": 2, "sum": 1.0}, {"rank": 1, "size": 2, "sum": 1.0}]


def test_standalone_spark_across_the_two_hosts_forms_one_job(hosts, tmp_path):
    """A standalone master in hosta, one worker (1 core) in each host, the driver in hosta."""
    home = Path(pyspark.__file__).parent
    spark_class = str(home / "bin" / "spark-class")
    a, b = hosts.NAMES
    env = {**SPARK_ENV, "SPARK_HOME": str(home), "SPARK_NO_DAEMONIZE": "1", "JAVA_HOME": _java_home()}
    master_url = f"spark://{hosts.addr[a]}:7077"
    daemons = [
        (hosts.ns(a, "env", f"SPARK_LOCAL_IP={hosts.addr[a]}", spark_class, "org.apache.spark.deploy.master.Master",
                  "--host", hosts.addr[a], "--port", "7077", "--webui-port", "18080"), env)]
    for host in (a, b):
        work = tmp_path / f"work-{host}"
        daemons.append((hosts.ns(host, "env", f"SPARK_LOCAL_IP={hosts.addr[host]}", spark_class,
                                 "org.apache.spark.deploy.worker.Worker", master_url, "--cores", "1", "--memory",
                                 "2g", "--work-dir", str(work), "--webui-port", "18081"), env))
    started = Started(daemons, tmp_path / "daemons")
    try:
        job = run_command(hosts.ns(a, "env", f"SPARK_LOCAL_IP={hosts.addr[a]}", sys.executable, str(DRIVER),
                                   master_url, str(tmp_path), "train"), tmp_path, timeout=400, env=env)
    finally:
        started.kill()
        daemon_logs = started.wait(30)
    if job.returncode != 0 or not (tmp_path / "spark.json").exists():
        job.fail(f"the Spark driver exited {job.returncode}\n--- the master and the workers:\n{show(daemon_logs)}")
    train = json.loads((tmp_path / "spark.json").read_text())["train"]
    assert train["error"] is None, train.get("traceback")
    assert [(r["rank"], r["size"]) for r in train["value"]] == [(0, 2), (1, 2)]
    reports = check_two_workers(tmp_path, "init", lines_by_rank(job.output, "horovodrun"))
    assert [reports[r]["cross_size"] for r in (0, 1)] == [2, 2]  # one rank in each host
    time.sleep(1)
    assert hosts.processes() == {"hosta": [], "hostb": []}


def _java_home() -> str:
    java = shutil.which("java")
    assert java, "java is missing: scripts/install_lab.sh installs openjdk-17-jre-headless"
    return str(Path(os.path.realpath(java)).parent.parent)


def test_spark_digits_example(tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "spark_digits.py"
    job = run_command([sys.executable, str(example), "--epochs", "2", "--out-dir", str(tmp_path / "out")], tmp_path,
                      timeout=400, env=SPARK_ENV)
    if job.returncode != 0:
        job.fail(f"examples/spark_digits.py exited {job.returncode}")
    finals = [line for line in job.output.splitlines() if line.startswith("rank ")]
    assert [line.split(":")[0] for line in finals] == ["rank 0 of 2", "rank 1 of 2"]
    assert len({line.split()[-1] for line in finals}) == 1  # the same global validation accuracy on both ranks
    assert float(finals[0].split()[-1]) > 0.8
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["spark-digits.keras"]
    print(finals[0])
