"""The multi-worker tier: every test here is marked `multiworker`; the lab is built once per session."""

import pytest
from lab import POD0, LabHosts, Slurm, require


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
