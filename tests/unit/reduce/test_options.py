"""hvdkeras.reduce.options: every option checked once when made, frozen after, the default bucket size read once."""

import pytest

from hvdkeras import _collectives as C
from hvdkeras import settings


def test_options_are_checked_once_and_frozen(hvd):
    import dataclasses

    from hvdkeras import Compression
    from hvdkeras.reduce.options import ReductionOptions

    options = ReductionOptions(compression="fp16", groups=[[1], [2]], bucket_bytes=0)
    assert options.compression is Compression.fp16 and options.groups == ((1,), (2,)) and options.bucket_bytes == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.op = C.Sum
    assert ReductionOptions.from_horovod(num_groups=3).groups == 3
    with pytest.raises(ValueError, match="not both"):
        ReductionOptions.from_horovod(num_groups=2, groups=2)
    with pytest.raises(ValueError, match="Received: gradient_predivide_factor=-1"):
        ReductionOptions(gradient_predivide_factor=-1)
    assert ReductionOptions(op=C.Sum).to_config()["op"] == "Sum"


def test_the_default_bucket_size_is_read_once_from_the_setting(monkeypatch):
    from hvdkeras.reduce.options import ReductionOptions

    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", "128")
    options = ReductionOptions()
    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", "256")
    # The process read its settings once: a variable changed afterwards is not seen ...
    assert options.bucket_bytes == 128 and ReductionOptions().bucket_bytes == 128
    settings.use(None)  # ... until the settings are read again, as a new process would
    assert options.bucket_bytes == 128 and ReductionOptions().bucket_bytes == 256
