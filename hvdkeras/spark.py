"""`hvdkeras.spark` is `hvdkeras.engines.spark`: this name stays importable, as the same module object."""

import sys

from hvdkeras.engines import spark as _engine

sys.modules[__name__] = _engine
