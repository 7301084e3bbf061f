"""`hvdkeras.data` is hvdkeras.training.data (the public name, as Horovod's `hvd.data`): one module under two names."""

import sys

from hvdkeras.training import data as _module

sys.modules[__name__] = _module
