"""The multi-worker tier: every test here is marked `multiworker`; the lab is built once per session, and the
worker scripts that need no fresh process run in one launch (`scenarios`)."""

import json

import pytest

from netlab import POD0, LabHosts, Slurm

from launch import WORKERS, Job, horovodrun_command, require, run_command


def pytest_collection_modifyitems(items):
    for item in items:
        if "multiworker" in str(item.fspath):
            item.add_marker(pytest.mark.multiworker)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real Slurm on this host (munged, slurmctld, slurmd), started once for the session."""
    require("slurmctld", "slurmd", "munged", "srun", "sbatch")
    cluster = Slurm(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def hosts(tmp_path_factory):
    """The two test hosts (network namespaces joined by a veth pair), made once for the session."""
    require("ip")
    lab = LabHosts(tmp_path_factory.mktemp("hosts"), aliases={"hosta": [POD0]}).start()
    yield lab
    lab.stop()


@pytest.fixture(scope="session")
def scenarios(request, tmp_path_factory) -> dict[str, Job]:
    """One 2-worker launch of every scenario that the collected test modules name in their SCENARIOS.

    workers/scenarios.py runs each workers/<name>_worker.py in turn in the same two processes; this returns
    {name: Job} with that scenario's rank results and out folder (`job.out`), and the launch's output.
    """
    names = []
    for item in request.session.items:
        for name in getattr(item.module, "SCENARIOS", ()):
            if name not in names:
                names.append(name)
    out = tmp_path_factory.mktemp("scenarios")
    launch = run_command(horovodrun_command(str(WORKERS / "scenarios.py"), *names), out, timeout=300 + 120 * len(names),
                         env={"HVDKERAS_TEST_DUMP_AFTER": "300"})
    if launch.returncode != 0:
        launch.fail(f"the scenarios launch ({', '.join(names)}) exited with {launch.returncode}")
    lines = launch.output.splitlines()
    jobs = {}
    for name in names:
        # This scenario's part of the output: from its first start line to its last done line (either rank).
        marks = [i for i, line in enumerate(lines) if f"scenario {name}: " in line]
        part = "\n".join(lines[marks[0]:marks[-1] + 1]) if marks else ""
        job = Job(returncode=launch.returncode, output=part, seconds=launch.seconds)
        job.out = out / name
        for rank in (0, 1):
            path = job.out / f"rank{rank}.json"
            if not path.exists():
                launch.fail(f"scenario {name}: rank {rank} wrote no result")
            job.results[rank] = json.loads(path.read_text())
        jobs[name] = job
    return jobs


@pytest.fixture(scope="module")
def job(request, scenarios) -> Job:
    """The first scenario of this test module's SCENARIOS."""
    return scenarios[request.module.SCENARIOS[0]]
