"""hvdkeras.cli.supervise: naming the rank that failed first, from horovodrun's output (`stream`) and from this
node's own workers (`supervise`), with real subprocesses."""

import io
import json
import os
import sys

import pytest

from hvdkeras.cli import supervise as supervision
from hvdkeras.cli.supervise import stream, supervise
from hvdkeras.failures import FailureReport, error_record, format_report, write_error_record


def _report(lines):
    report = FailureReport()
    for line in lines:
        supervision.feed(report, line)
    return report


def _first(report):
    root = report.root_cause()
    return root.rank, root.exitcode


def test_the_first_failed_rank_is_the_root_cause():
    report = _report([b"Process 0 exit with status code 0.\n", b"Process 1 exit with status code -9.\n",
                      b"Process 0 exit with status code 1.\n"])
    assert _first(report) == (1, -9)
    assert "rank 1 failed first (signal SIGKILL)" in format_report(report)


def test_ranks_that_only_failed_because_of_another_are_not_the_cause():
    report = _report([b"[1]<stderr>:RuntimeError: injected failure on rank 1\n",
                      b"[0]<stderr>:Horovod has been shut down. This was caused by an exception on one of the ranks\n",
                      b"Process 0 exit with status code 1.\n", b"Process 1 exit with status code 1.\n"])
    assert _first(report) == (1, 1)
    only_collateral = _report([b"[0]<stderr>:Timed out waiting 30000ms for recv\n",
                               b"Process 0 exit with status code 1.\n"])
    assert _first(only_collateral) == (0, 1)


def test_a_rank_that_raised_and_was_terminated_before_it_exited_is_the_cause():
    # What horovodrun printed when the survivor exited first and the rank that raised was then terminated.
    report = _report([b"[1]<stderr>:Traceback (most recent call last):\n",
                      b"[1]<stderr>:RuntimeError: injected failure on rank 1\n",
                      b"[0]<stderr>:Traceback (most recent call last):\n",
                      b"[0]<stderr>:Horovod has been shut down. This was caused by an exception on one of the ranks\n",
                      b"Process 0 exit with status code 1.\n",
                      b"Terminating remaining workers after failure of Process 0.\n",
                      b"[1]<stderr>:Terminated\n", b"Process 1 exit with status code 143.\n"])
    assert _first(report) == (1, None)
    assert "143" not in format_report(report).splitlines()[0]


def test_the_error_record_gives_the_real_exit_code_and_traceback_not_the_launchers_sigterm(tmp_path):
    record = error_record(1, "Traceback (most recent call last):\n  File x\nRuntimeError: injected",
                          environ={"HOROVOD_RANK": "1", "HOROVOD_LOCAL_RANK": "1"})
    out = io.StringIO()
    path = write_error_record(record, str(tmp_path / "errors"), stream=out)
    assert json.loads((tmp_path / "errors" / "rank1.json").read_text())["exitcode"] == 1
    marker = out.getvalue().strip()
    report = _report([f"[1]<stderr>:{marker}\n".encode(),
                      b"[0]<stderr>:Horovod has been shut down. This was caused by an exception on one of the ranks\n",
                      b"Process 0 exit with status code 1.\n", b"Process 1 exit with status code 143.\n"])
    text = format_report(report)
    assert _first(report) == (1, 1)
    assert "rank 1 failed first (exit code 1)" in text and "143" not in text and "SIGTERM" not in text
    assert f"error file : {path}" in text and "RuntimeError: injected" in text
    assert f"pid {record['pid']}" in text and "local rank 1" in text
    assert not supervision.feed(FailureReport(), f"[1]<stderr>:{marker}\n".encode())  # not shown


def test_a_fatal_signal_keeps_faulthandlers_traceback():
    report = _report([b"[1]<stderr>:Fatal Python error: Segmentation fault\n",
                      b"[1]<stderr>:  File \"/x/train.py\", line 9 in <module>\n",
                      b"Process 1 exit with status code 139.\n", b"Process 0 exit with status code 143.\n"])
    text = format_report(report)
    assert _first(report) == (1, 139) and "signal SIGSEGV" in text and "train.py" in text


def test_a_hang_ended_by_the_stall_bound_names_the_rank_that_did_not_fail_by_itself():
    report = FailureReport(stall_timeout=20)
    for line in [b"[0]<stderr>:Traceback (most recent call last):\n",
                 b"[0]<stderr>:HorovodInternalError: Timed out waiting 20000ms for recv\n",
                 b"Process 0 exit with status code 1.\n", b"Process 1 exit with status code 143.\n"]:
        supervision.feed(report, line)
    root = report.root_cause()
    assert root.rank == 1 and "stopped answering" in format_report(report)
    assert "--stall-timeout 20 s" in format_report(report)


def test_horovods_stall_report_names_the_rank_and_the_tensors_it_is_missing():
    # Rank 2 of 3 stopped submitting; rank 0's stall inspector lists it (and, first, rank 1 that caught up).
    report = FailureReport(stall_timeout=20)
    for line in [b"[0]<stderr>:[2026-12-05 09:00:00.000000: E horovod/common/stall_inspector.cc:107] One or more "
                 b"tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting "
                 b"for remainder of ranks for more than 3 seconds. \n",
                 b"[0]<stderr>:Missing ranks:\n",
                 b"[0]<stderr>:1: [grads_7]\n",
                 b"[0]<stderr>:2!: [HorovodAllreduce_grads_0, HorovodAllreduce_grads_1]\n",
                 b"[0]<stderr>:One or more rank (marked by \"!\") is stalled for longer than 14 seconds. "
                 b"Will shutdown.\n",
                 b"[0]<stderr>:Traceback (most recent call last):\n",
                 b"[0]<stderr>:HorovodInternalError: Horovod has been shut down.\n",
                 b"[1]<stderr>:Traceback (most recent call last):\n",
                 b"[1]<stderr>:HorovodInternalError: Horovod has been shut down.\n",
                 b"Process 0 exit with status code 1.\n", b"Process 1 exit with status code 1.\n",
                 b"Process 2 exit with status code 143.\n"]:
        assert supervision.feed(report, line)  # passed through: the user sees Horovod's own lines too
    assert report.missing == {1: ["grads_7"], 2: ["HorovodAllreduce_grads_0", "HorovodAllreduce_grads_1"]}
    text = format_report(report)
    assert report.root_cause().rank == 2, text
    first = text.splitlines()[0]
    assert "rank 2 failed first (stopped answering: it stopped submitting collectives and the others" in first, text
    assert "  missing    : HorovodAllreduce_grads_0, HorovodAllreduce_grads_1" in text, text
    assert "143" not in first and "SIGTERM" not in first


def test_the_stall_bound_sets_horovods_stall_inspector_within_it():
    from hvdkeras.settings import horovod_stall_environ

    for stall in (0.5, 1, 5, 20, 60, 600.5):
        env = horovod_stall_environ(stall, end_hangs=True)
        check, shutdown = int(env["HOROVOD_STALL_CHECK_TIME_SECONDS"]), int(env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"])
        assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == f"{stall:g}"
        # Horovod ignores a shutdown time under the check time; a cached collective is found a look later.
        assert 1 <= check <= shutdown and shutdown + 2 * check <= max(3, -(-stall // 1)), (stall, env)
    assert horovod_stall_environ(60) == {"HOROVOD_GLOO_TIMEOUT_SECONDS": "60"}  # Horovod's own defaults otherwise
    assert horovod_stall_environ(60, end_hangs=True) == {
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "60", "HOROVOD_STALL_CHECK_TIME_SECONDS": "10",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "40"}


def worker(code: str) -> list[str]:
    return [sys.executable, "-c", code]


# Every launch here is bounded: a hang fails the test (pytest-timeout), with the workers' output captured.
@pytest.mark.timeout(120)
def test_supervise_prefixes_each_workers_output_and_stops_the_others_when_one_fails(capfd, tmp_path):
    survived = tmp_path / "rank1-finished"
    workers = [
        (worker("import sys, time; print('one'); sys.stdout.flush(); time.sleep(0.5); sys.exit(3)"), {"RANK": "0"}),
        (worker(f"import time; print('two', flush=True); time.sleep(60); open({str(survived)!r}, 'w').close()"),
         {"RANK": "1"}),
    ]
    code = supervise(workers, grace=1.0)
    assert code == 3
    assert not survived.exists()  # rank 1 was stopped, not waited for
    out, err = capfd.readouterr()
    assert "[0]<stdout>:one" in out and "[1]<stdout>:two" in out
    assert "rank 0 failed first on this node (exit code 3)" in err


@pytest.mark.timeout(120)
def test_supervise_returns_0_when_every_worker_succeeds(capfd):
    assert supervise([(worker("print('ok')"), {"RANK": str(r)}) for r in range(2)]) == 0
    out, _ = capfd.readouterr()
    assert sorted(line for line in out.splitlines()) == ["[0]<stdout>:ok", "[1]<stdout>:ok"]


@pytest.mark.timeout(120)
def test_supervise_keeps_an_error_folder_the_user_named(monkeypatch, tmp_path):
    folder = tmp_path / "errors"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    monkeypatch.setenv("HVDKERAS_ERROR_DIR", str(folder))
    assert supervise([(worker("print('ok')"), {"RANK": str(r)}) for r in range(2)]) == 0
    assert (folder / "keep.txt").read_text() == "mine"


@pytest.mark.timeout(120)
def test_stream_passes_the_output_through_and_names_the_rank_that_failed_first(capfd):
    printed = ("import sys\n"
               "print('[1]<stderr>:Traceback (most recent call last)')\n"
               "print('[0]<stderr>:RuntimeError: Horovod has been shut down')\n"
               "print('Process 0 exit with status code 1')\n"
               "print('Process 1 exit with status code 2')\n"
               "sys.exit(1)\n")
    assert stream(worker(printed), dict(os.environ)) == 1
    out, err = capfd.readouterr()
    assert "Process 1 exit with status code 2" in out
    assert "rank 1 failed first (exit code 2)" in err


@pytest.mark.timeout(120)
def test_stream_without_rank_names_says_only_the_exit_code(capfd):
    assert stream(worker("import sys; sys.exit(4)"), dict(os.environ), name_failed_rank=False) == 4
    assert "the job failed (horovodrun exit code 4)" in capfd.readouterr().err
