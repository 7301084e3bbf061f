"""`hvdkeras.elastic` is hvdkeras.training.elastic (the public name, as Horovod's `hvd.elastic`): one module under
two names."""

import sys

from hvdkeras.training import elastic as _module

sys.modules[__name__] = _module
