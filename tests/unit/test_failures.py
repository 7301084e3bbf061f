"""hvdkeras.failures: the one list of what a failure caused by a lost peer says."""

import pytest

from hvdkeras.failures import LOST_PEER_MARKERS, lost_peer


@pytest.mark.parametrize("text", [
    "Horovod has been shut down. This was caused by an exception on one of the ranks",
    "[1]<stderr>:gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]:3345",
    b"[0]<stderr>:RuntimeError: Timed out waiting 30000ms for recv operation to complete",
    "HorovodInternalError: ncclAllReduce failed",
    "connect: No route to host",
])
def test_lost_peers_are_recognised_in_text_and_in_output_lines(text):
    assert lost_peer(text)


@pytest.mark.parametrize("text", ["ValueError: shapes (2,) and (3,) not aligned", b"[0]<stdout>:Epoch 1/3", ""])
def test_a_workers_own_error_is_not_a_lost_peer(text):
    assert not lost_peer(text)


def test_one_list():
    assert len(set(LOST_PEER_MARKERS)) == len(LOST_PEER_MARKERS)
