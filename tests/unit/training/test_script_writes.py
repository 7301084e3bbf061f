"""The script's own writes under the wrap, in one process playing rank 1 (the rank is faked): folders wait for
rank 0's, TensorFlow checkpoints and summaries are written by rank 0 only, and the objects advance as rank 0's."""

import os
import tempfile
import threading
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from hvdkeras.training import script_writes


@pytest.fixture
def as_rank(monkeypatch):
    def play(rank: int, job_start: float | None = None, wait_seconds: float = 5):
        script_writes.install(job_start=time.time() - 1 if job_start is None else job_start,
                              wait_seconds=wait_seconds)
        monkeypatch.setattr(script_writes, "_rank", lambda: rank)

    yield play
    script_writes.uninstall()


def _rank0_makes(*folders, after: float = 0.2):
    """Rank 0, a moment later: makes `folders` with the plain os.mkdir. Returns a function that waits for rank 0 to
    finish and gives True for each folder it made (it raises FileExistsError where rank 1 made the folder first,
    which rank 1 must not)."""
    made: list = []

    def make():
        for folder in folders:
            os.mkdir.__wrapped__(folder)
            made.append(True)

    timer = threading.Timer(after, make)
    timer.start()

    def done() -> list:
        timer.join(timeout=10)  # rank 1 may return between rank 0's mkdir and its append
        return made

    return done


def test_rank1_mkdir_waits_for_rank0s_folder_and_takes_it_as_its_own(as_rank, tmp_path):
    as_rank(1)
    target = tmp_path / "ckpt"
    made = _rank0_makes(target)
    os.mkdir(target)  # the script's own call: waits for rank 0's folder, then returns as if it had made it
    assert made() == [True]
    made = _rank0_makes(target / "a", target / "a" / "b")
    os.makedirs(target / "a" / "b")  # makedirs goes through mkdir: it waits too, and raises nothing
    assert made() == [True, True]


def test_a_folder_rank0_never_makes_is_made_after_the_wait(as_rank, monkeypatch, tmp_path):
    """A folder only rank 1's script names (one per rank): rank 1 waits `wait_seconds` for it, then makes it.
    The clock is the test's: each of the wait's sleeps moves it on."""
    clock = types.SimpleNamespace(now=100.0)

    def sleep(seconds):
        clock.now += seconds

    monkeypatch.setattr(script_writes, "time", types.SimpleNamespace(monotonic=lambda: clock.now, sleep=sleep))
    as_rank(1, wait_seconds=7.5)
    os.mkdir(tmp_path / "rank1")
    assert (tmp_path / "rank1").is_dir()
    assert 7.5 <= clock.now - 100.0 < 7.5 + 0.1  # the whole wait, in its 0.05 s steps, and no more


def test_a_folder_from_before_the_job_still_raises(as_rank, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    as_rank(0, job_start=time.time() + 5)  # the job started after the folder was made
    with pytest.raises(FileExistsError):
        os.mkdir(old)


def test_rank0_takes_a_folder_another_rank_made_during_the_job(as_rank, tmp_path):
    as_rank(0)
    os.mkdir.__wrapped__(tmp_path / "made")
    os.mkdir(tmp_path / "made")  # made since the job started: no FileExistsError


def test_libraries_are_not_affected(as_rank, monkeypatch):
    as_rank(1)
    waited = []
    monkeypatch.setattr(script_writes.time, "sleep", lambda seconds: waited.append(seconds))
    folder = tempfile.mkdtemp()  # tempfile calls os.mkdir: it must neither wait nor be skipped
    assert os.path.isdir(folder) and waited == []
    os.rmdir(folder)


def test_a_librarys_makedirs_is_not_affected(as_rank, monkeypatch, tmp_path):
    """os.makedirs called by a library (Keras saving a model) goes through os.mkdir from os's own frames, which
    Python 3.11 runs frozen ("<frozen os>"): they are looked through to the library, which neither waits."""
    from keras.src.utils import file_utils

    as_rank(1)
    waited = []
    monkeypatch.setattr(script_writes.time, "sleep", lambda seconds: waited.append(seconds))
    file_utils.makedirs(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").is_dir() and waited == []


def test_checkpoint_manager_on_rank1_writes_nothing_and_advances_as_rank0(as_rank, tmp_path):
    v = tf.Variable(1.0)
    ckpt = tf.train.Checkpoint(v=v)
    manager = tf.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)
    as_rank(1)
    paths = [manager.save() for _ in range(3)]
    assert paths == [str(tmp_path / f"ckpt-{i}") for i in (1, 2, 3)]
    assert manager.latest_checkpoint == paths[-1] and manager.checkpoints == paths[1:]
    assert int(ckpt.save_counter) == 3
    assert os.listdir(tmp_path) == []
    assert ckpt.save(str(tmp_path / "plain")) == str(tmp_path / "plain-4")
    assert os.listdir(tmp_path) == []


def test_restore_of_a_checkpoint_rank0_is_writing_waits_for_it(as_rank, tmp_path):
    v = tf.Variable(1.0)
    ckpt = tf.train.Checkpoint(v=v)
    as_rank(1)
    path = ckpt.write(str(tmp_path / "c"))  # rank 1: nothing written
    writer = tf.train.Checkpoint(v=tf.Variable(7.0))

    def rank0_writes():
        time.sleep(0.3)
        type(writer)._write.__wrapped__(writer, path)  # rank 0's write: TensorFlow's own

    threading.Thread(target=rank0_writes).start()
    ckpt.restore(path)
    np.testing.assert_allclose(v.numpy(), 7.0)


def test_summary_writer_of_rank1_writes_nothing(as_rank, tmp_path):
    as_rank(1)
    writer = tf.summary.create_file_writer(str(tmp_path / "logs"))
    with writer.as_default():
        tf.summary.write("loss", 1.0, step=0)  # the op every summary writes through (no TensorBoard needed)
    writer.flush()
    assert not (tmp_path / "logs").exists()
