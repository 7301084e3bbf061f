import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def hvd():
    """hvdkeras initialized as a single worker (Horovod size 1, no launcher needed)."""
    import hvdkeras

    hvdkeras.init()
    return hvdkeras
