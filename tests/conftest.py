import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def hvd():
    """hvdkeras initialized as a single worker (Horovod size 1, no launcher needed)."""
    import hvdkeras

    hvdkeras.init()
    return hvdkeras


# Multi-worker modules that run apart from the others, on the other pytest worker: they bring their own lab
# (two more network namespaces, tagged with that worker's pid) and mostly wait on the engine's own timers.
APART = ("tests/multiworker/test_ray_2w.py",)


def pytest_xdist_make_scheduler(config, log):
    """Under `pytest -n 2` (make test): every multi-worker test in one work unit, run in order on one pytest
    worker (they share the lab and the scenarios launch, and each job wants both cores). The modules in
    APART are a unit each, and the single-process tests are spread over the workers, so they run on the
    other core meanwhile."""
    from xdist.scheduler import LoadScopeScheduling

    class MultiworkerTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in APART:
                return module
            return "tests/multiworker" if nodeid.startswith("tests/multiworker/") else nodeid

    return MultiworkerTogether(config, log)
