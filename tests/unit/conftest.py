"""The one fake of the Horovod seam (hvdkeras._collectives) for the unit tests: the `fake_seam` fixture."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import tensorflow as tf

from hvdkeras import _collectives as C


class FakeSeam:
    """Stands in for hvdkeras._collectives in one process, undone after the test (it patches through pytest's
    monkeypatch).

    - `set(size=, rank=, **functions)`: the world this process sees (`size()`, `rank()`), and any other
      collective replaced by a function of the test's.
    - `second_worker()`: a second worker whose tensors are 3x ours: an average is then 2x ours, a sum 4x, an
      allgather holds ours twice. Every grouped allreduce and allgather is recorded in `calls` as
      ("grouped_allreduce", number of tensors, op) or ("allgather",).
    - `recording()`: grouped allreduces reduce nothing and are recorded as (name, [shapes]).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self._monkeypatch = monkeypatch
        self.calls: list = []
        self.process_set: Any = None

    def set(self, size: int | None = None, rank: int | None = None, **functions: Callable) -> FakeSeam:
        if size is not None:
            functions.setdefault("size", lambda: size)
        if rank is not None:
            functions.setdefault("rank", lambda: rank)
        for name, function in functions.items():
            if not hasattr(C, name):
                raise AttributeError(f"hvdkeras._collectives has no {name!r} to fake")
            self._monkeypatch.setattr(C, name, function)
        return self

    def second_worker(self) -> FakeSeam:
        return self.set(size=2, grouped_allreduce=self._grouped_allreduce, allgather=self._allgather,
                        size_tensor=lambda process_set=C.global_process_set: tf.constant(2))

    def recording(self) -> FakeSeam:
        return self.set(size=2, grouped_allreduce=self._record)

    def _grouped_allreduce(self, tensors, op=C.Average, prescale_factor=1.0, postscale_factor=1.0, name=None,
                           process_set=C.global_process_set):
        self.calls.append(("grouped_allreduce", len(tensors), op))
        self.process_set = process_set
        total = [(t * prescale_factor + 3 * t * prescale_factor) * postscale_factor for t in tensors]
        return [s / 2 if op == C.Average else s for s in total]

    def _allgather(self, tensor, name=None, process_set=C.global_process_set):
        self.calls.append(("allgather",))
        return tf.concat([tensor, tensor], axis=0)

    def _record(self, tensors, name=None, **kwargs):  # noqa: ARG002
        self.calls.append((name, [tuple(t.shape) for t in tensors]))
        return [tf.identity(t) for t in tensors]


@pytest.fixture
def fake_seam(monkeypatch) -> FakeSeam:
    """A FakeSeam for this test: nothing is faked until the test says what (`set`, `second_worker`, ...)."""
    return FakeSeam(monkeypatch)


@pytest.fixture(autouse=True)
def settings_read_by_each_test():
    """Each test is a process of its own for the settings: what it sets in HVDKERAS_* before using hvdkeras is
    read once (settings.current), and nothing is left for the next test."""
    from hvdkeras import settings

    settings.use(None)
    yield
    settings.use(None)
