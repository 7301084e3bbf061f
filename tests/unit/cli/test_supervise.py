"""hvdkeras.cli.supervise: naming the rank that failed first, from horovodrun's output (`stream`) and from this
node's own workers (`supervise`), with real subprocesses."""

import os
import sys

import pytest

from hvdkeras.cli import supervise as supervision
from hvdkeras.cli.supervise import stream, supervise


def test_failure_tracker_takes_the_first_failed_rank():
    tracker = supervision.FailureTracker()
    for line in [b"Process 0 exit with status code 0.\n", b"Process 1 exit with status code -9.\n",
                 b"Process 0 exit with status code 1.\n"]:
        tracker.feed(line)
    assert tracker.first_failure() == (1, -9)


def test_failure_tracker_skips_ranks_that_only_failed_because_of_another():
    tracker = supervision.FailureTracker()
    for line in [b"[1]<stderr>:RuntimeError: injected failure on rank 1\n",
                 b"[0]<stderr>:Horovod has been shut down. This was caused by an exception on one of the ranks\n",
                 b"Process 0 exit with status code 1.\n", b"Process 1 exit with status code 1.\n"]:
        tracker.feed(line)
    assert tracker.first_failure() == (1, 1)
    only_collateral = supervision.FailureTracker()
    for line in [b"[0]<stderr>:Timed out waiting 30000ms for recv\n", b"Process 0 exit with status code 1.\n"]:
        only_collateral.feed(line)
    assert only_collateral.first_failure() == (0, 1)


def test_failure_tracker_names_a_rank_that_raised_and_was_terminated_before_it_exited():
    # What horovodrun printed when the survivor exited first and the rank that raised was then terminated.
    tracker = supervision.FailureTracker()
    for line in [b"[1]<stderr>:Traceback (most recent call last):\n",
                 b"[1]<stderr>:RuntimeError: injected failure on rank 1\n",
                 b"[0]<stderr>:Traceback (most recent call last):\n",
                 b"[0]<stderr>:Horovod has been shut down. This was caused by an exception on one of the ranks\n",
                 b"Process 0 exit with status code 1.\n",
                 b"Terminating remaining workers after failure of Process 0.\n",
                 b"[1]<stderr>:Terminated\n"]:
        tracker.feed(line)
    assert tracker.first_failure() == (1, None)


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
