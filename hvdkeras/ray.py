"""`hvdkeras.ray` is `hvdkeras.engines.ray`: this name stays importable, as the same module object."""

import sys

from hvdkeras.engines import ray as _engine

sys.modules[__name__] = _engine
