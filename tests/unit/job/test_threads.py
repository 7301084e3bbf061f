"""The priority of the threads Horovod starts (hvdkeras.job.threads), with a stand-in for Horovod's start."""

import logging
import os
import threading

import pytest

from hvdkeras.job import threads as _threads

GLOO = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"}  # as hvdkeras's rendezvous and horovodrun --gloo set it


@pytest.mark.parametrize("environ, spans_hosts, expected", [
    (GLOO, True, -15),                                  # across hosts over Gloo: Horovod's threads first
    ({"HOROVOD_CONTROLLER": "gloo"}, True, -15),
    (GLOO, False, None),                                # one host: as Horovod starts them
    ({}, True, None),                                   # an MPI controller: not measured, left alone
    ({"HVDKERAS_HOROVOD_NICE": "5"}, False, 5),         # the user's value, on any job
    ({"HVDKERAS_HOROVOD_NICE": " -20 "}, True, -20),
    ({**GLOO, "HVDKERAS_HOROVOD_NICE": "none"}, True, None),  # leave them alone
    ({**GLOO, "HVDKERAS_HOROVOD_NICE": "None"}, True, None),
    ({**GLOO, "HVDKERAS_HOROVOD_NICE": ""}, True, -15),
])
def test_the_nice_value_comes_from_the_variable_or_the_job(environ, spans_hosts, expected):
    assert _threads.horovod_nice(environ, spans_hosts) == expected


@pytest.mark.parametrize("raw", ["high", "1.5", "-21", "20"])
def test_a_bad_nice_value_says_what_was_received(raw):
    with pytest.raises(ValueError, match=rf"integer from -20 to 19, or `none`.*Received: "
                                         rf"HVDKERAS_HOROVOD_NICE='{raw}'"):
        _threads.horovod_nice({"HVDKERAS_HOROVOD_NICE": raw}, True)


class Started:
    """A stand-in for Horovod's start: starts one thread that waits until it is told to end."""

    def __init__(self):
        self.done = threading.Event()
        self.ready = threading.Event()
        self.tid = None

    def __call__(self):
        def run():
            self.tid = threading.get_native_id()
            self.ready.set()
            self.done.wait(30)

        threading.Thread(target=run, daemon=True).start()
        self.ready.wait(30)


def nice_of(tid):
    return os.getpriority(os.PRIO_PROCESS, tid)


def test_only_the_threads_the_start_began_are_reniced():
    start = Started()
    mine = nice_of(threading.get_native_id())
    try:
        # A lower priority needs no privilege, so this runs anywhere; the two-host test checks -15.
        reniced = _threads.start_prioritized(start, min(mine + 5, 19))
        assert reniced == [start.tid]
        assert nice_of(start.tid) == min(mine + 5, 19)
        assert nice_of(threading.get_native_id()) == mine  # the caller's thread keeps its priority
    finally:
        start.done.set()


def test_none_leaves_every_thread_as_it_started():
    start = Started()
    try:
        assert _threads.start_prioritized(start, None) == []
        assert nice_of(start.tid) == nice_of(threading.get_native_id())
    finally:
        start.done.set()


def test_without_the_privilege_the_threads_keep_their_priority_and_it_is_said(monkeypatch, caplog):
    def refuse(which, who, prio):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "setpriority", refuse)
    start = Started()
    try:
        with caplog.at_level(logging.INFO, logger="hvdkeras"):
            assert _threads.start_prioritized(start, -15) == []
        assert "Horovod's threads keep their priority: nice -15 needs CAP_SYS_NICE" in caplog.text
    finally:
        start.done.set()


def test_starting_horovod_across_hosts_renices_what_it_started(monkeypatch, fake_seam):
    from hvdkeras.job import lifecycle

    start = Started()
    fake_seam.set(init=lambda comm=None, process_sets=None: start())
    monkeypatch.setenv("HOROVOD_CROSS_SIZE", "2")
    mine = nice_of(threading.get_native_id())
    monkeypatch.setenv("HVDKERAS_HOROVOD_NICE", str(min(mine + 3, 19)))
    try:
        assert lifecycle._start_horovod(None, None) == [start.tid] and nice_of(start.tid) == min(mine + 3, 19)
    finally:
        start.done.set()


def test_a_bad_nice_value_fails_before_horovod_starts(monkeypatch, fake_seam):
    from hvdkeras.job import lifecycle

    calls = []
    fake_seam.set(init=lambda comm=None, process_sets=None: calls.append(1))
    monkeypatch.setenv("HVDKERAS_HOROVOD_NICE", "urgent")
    with pytest.raises(ValueError, match="Received: HVDKERAS_HOROVOD_NICE='urgent'"):
        lifecycle._start_horovod(None, None)
    assert calls == []


class FakeThreading:
    """tf.config.threading's inter-op calls; `started`: TensorFlow's runtime has started (setting raises)."""

    def __init__(self, configured: int, started: bool = False):
        self.configured, self.started = configured, started

    def get_inter_op_parallelism_threads(self):
        return self.configured

    def set_inter_op_parallelism_threads(self, n):
        if self.started:
            raise RuntimeError("Inter op parallelism cannot be modified after initialization.")
        self.configured = n


@pytest.mark.parametrize("configured, environ, cores, how", [
    (1, {}, 8, "tf.config.threading.set_inter_op_parallelism_threads(1)"),
    (0, {"TF_NUM_INTEROP_THREADS": "1"}, 8, "TF_NUM_INTEROP_THREADS=1"),
    (0, {}, 1, "TensorFlow's choice for a process with one core"),
    (0, {}, 2, None), (2, {}, 1, None), (0, {"TF_NUM_INTEROP_THREADS": "4"}, 1, None),
])
def test_how_tensorflow_comes_to_one_inter_op_thread(configured, environ, cores, how):
    assert _threads.one_inter_op_thread(configured, environ, cores) == how


def test_one_core_and_nothing_set_gets_two_inter_op_threads_before_tensorflow_starts():
    fake = FakeThreading(0)
    said = []
    assert _threads.check_inter_op_threads(2, fake, {}, cores=1, say=said.append) == "set 2"
    assert fake.configured == 2 and not said
    # A single worker is left alone: nothing to overlap.
    alone = FakeThreading(0)
    assert _threads.check_inter_op_threads(1, alone, {}, cores=1, say=said.append) is None and alone.configured == 0


@pytest.mark.parametrize("fake, environ", [(FakeThreading(1), {}), (FakeThreading(0), {"TF_NUM_INTEROP_THREADS": "1"}),
                                           (FakeThreading(0, started=True), {})])
def test_one_inter_op_thread_asked_for_or_too_late_to_change_is_said_once(fake, environ):
    said = []
    message = _threads.check_inter_op_threads(2, fake, environ, cores=1, say=said.append)
    assert said == [message] and "one inter-op thread" in message and "TF_NUM_INTEROP_THREADS=2" in message
    assert fake.configured in (0, 1)  # what the script asked for stays
