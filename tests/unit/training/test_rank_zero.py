"""hvdkeras.training.rank_zero: rank 0 does the work, the others wait for it, and a failure on rank 0 releases them."""

import pytest

from hvdkeras.training import rank_zero


def test_on_rank_zero_releases_the_others_before_raising(monkeypatch):
    calls = []
    monkeypatch.setattr(rank_zero, "barrier", lambda: calls.append("barrier"))

    def boom():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        rank_zero.on_rank_zero(boom)
    assert calls == ["barrier"]


def test_other_ranks_wait_and_return_none(fake_seam):
    waited = []
    fake_seam.set(size=2, rank=1, is_initialized=lambda: True, barrier=lambda: waited.append(1))
    assert not rank_zero.is_rank_zero()
    assert rank_zero.on_rank_zero(lambda: "written") is None and waited == [1]
    assert rank_zero.on_rank_zero(lambda: "written", wait=False) is None and waited == [1]
    fake_seam.set(rank=0)
    assert rank_zero.on_rank_zero(lambda: "written") == "written" and waited == [1, 1]


def test_inside_solo_nothing_waits(fake_seam):
    fake_seam.set(size=2, rank=0, is_initialized=lambda: True, barrier=lambda: pytest.fail("solo code waited"))
    with rank_zero.solo():
        assert rank_zero.on_rank_zero(lambda: 7) == 7


def test_a_process_that_never_called_init_is_rank_zero(fake_seam):
    fake_seam.set(is_initialized=lambda: False)
    assert rank_zero.is_rank_zero()
    rank_zero.barrier()  # a no-op
