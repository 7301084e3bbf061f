import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def hvd():
    """hvdkeras initialized as a single worker (Horovod size 1, no launcher needed)."""
    import hvdkeras

    hvdkeras.init()
    return hvdkeras


# The multi-worker modules that run in the second lane, on the other pytest worker: none of them needs Slurm,
# the session's scenarios launch or the first lane's two test hosts (Ray brings its own, tagged with that
# worker's pid). The Ray tests mostly wait on Ray's own timers, and the others are the long launches that do
# not share a fixture with the first lane. Every other multi-worker module is in the first lane.
SECOND_LANE = (
    "tests/multiworker/test_corpus_2w.py",
    "tests/multiworker/test_examples_2w.py",
    "tests/multiworker/test_faults_2w.py",
    "tests/multiworker/test_loops_2w.py",
    "tests/multiworker/test_ray_2w.py",
    "tests/multiworker/test_reducer_flags_2w.py",
    "tests/multiworker/test_wrap_2w.py",
)


def pytest_xdist_make_scheduler(config, log):
    """Under `pytest -n 2` (make test): the multi-worker tests in two lanes, each one work unit run in order
    on one pytest worker (a lane's modules share its lab and fixtures, and each job wants both cores); the
    single-process tests are spread over the workers and fill whichever lane ends first."""
    from xdist.scheduler import LoadScopeScheduling

    class MultiworkerLanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in SECOND_LANE:
                return "tests/multiworker (second lane)"
            return "tests/multiworker" if nodeid.startswith("tests/multiworker/") else nodeid

    return MultiworkerLanes(config, log)
