"""Elastic training on real workers: lose one in epoch 2, keep training, let one join again.

The discovery script lists two local host names (localhost and 127.0.0.1), one slot each: Horovod's driver
blacklists the host of a failed worker, so the survivor must be on another host name. After the loss the
test raises localhost's slot count to 2 and a new worker joins there.
"""

import json
import stat
import subprocess
import threading
import time

import psutil
import pytest

from launch import REPO, VENV_BIN, base_env, dump_and_kill, kill_tree

EPOCHS = 8
# Steps per epoch. Sharded, every commit (each step) gathers the optimizer's whole state: fewer steps.
STEPS = {"unsharded": 100, "sharded": 25}


def worker_on(host: str, script: str) -> psutil.Process | None:
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if script in " ".join(proc.info["cmdline"] or []) and proc.environ().get("HOROVOD_HOSTNAME") == host:
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


@pytest.fixture(scope="module", params=["unsharded", "sharded"])
def job(request, tmp_path_factory):
    """The elastic job, with the optimizer's state whole on each worker, then sharded across them (re-sharded
    from the committed state when the world shrinks to one and grows back to two)."""
    out = tmp_path_factory.mktemp(f"elastic-{request.param}")
    hosts = out / "hosts.txt"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    discover = out / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(discover.stat().st_mode | stat.S_IEXEC)
    script = str(REPO / "examples" / "elastic_digits.py")
    cmd = [str(VENV_BIN / "hvdkeras"), "run", "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(discover), "--no-shard", "--report-dir", str(out / "report"),
           script, "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS[request.param]),
           *(["--shard-optimizer-state"] if request.param == "sharded" else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(out),
                            env=base_env(out), start_new_session=True)
    lines, events = [], {}
    timer = threading.Timer(240, dump_and_kill, (proc.pid,))
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if "killed" not in events and line.startswith("[0]<stdout>:Epoch 2/"):
                time.sleep(0.5)  # in the middle of epoch 2
                victim = worker_on("127.0.0.1", script)
                if victim is not None:
                    victim.kill()
                    events["killed"] = time.time()
            elif "killed" in events and "joined" not in events and "Epoch 3/" in line:
                hosts.write_text("localhost:2\n")  # the survivor trains alone: let a worker join again
                events["joined"] = time.time()
        code = proc.wait()
    finally:
        timer.cancel()
        kill_tree(proc.pid)
    output = "".join(lines)
    if code != 0 or "killed" not in events:
        pytest.fail(f"elastic job exited {code}, events {events}\n{output[-20000:]}", pytrace=False)
    reports = {}
    for path in (out / "report").glob("rank*.json"):
        report = json.loads(path.read_text())
        reports[report["rank"]] = report
    return {"output": output, "events": events, "reports": reports, "steps": STEPS[request.param],
            "sharded": request.param == "sharded"}


def test_training_finishes_every_planned_step(job):
    final = [line for line in job["output"].splitlines() if "finished" in line and "steps" in line]
    assert final, job["output"][-5000:]
    assert f"finished {EPOCHS} epochs, {EPOCHS * job['steps']} steps" in final[-1]
    assert f"optimizer state {'sharded' if job['sharded'] else 'whole'}" in final[-1]


def test_worker_joined_back_and_holds_identical_weights(job):
    assert "joined" in job["events"]
    assert job["reports"][0]["size"] == 2 and job["reports"][1]["size"] == 2
    assert job["reports"][0]["weights_sha256"] == job["reports"][1]["weights_sha256"]
