"""hvdkeras.rank_zero: rank 0 does the work, the others wait for it, and a failure on rank 0 releases them."""

import pytest

from hvdkeras import rank_zero


def test_on_rank_zero_releases_the_others_before_raising(monkeypatch):
    calls = []
    monkeypatch.setattr(rank_zero, "barrier", lambda: calls.append("barrier"))

    def boom():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        rank_zero.on_rank_zero(boom)
    assert calls == ["barrier"]
