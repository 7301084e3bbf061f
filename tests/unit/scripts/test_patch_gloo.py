"""scripts/patch_gloo.py: Gloo's alltoallv and allgatherv post their receives first, on the loops of Horovod
0.28.1's vendored Gloo (third_party/gloo/gloo, recorded 2026-12-03), and refuse any other source."""


import pytest

from . import SCRIPTS, load

patch_gloo = load("patch_gloo")
SCRIPT = SCRIPTS / "patch_gloo.py"

ALLTOALLV = """\
  // Remote copy.
  for (int i = 1; i < worldSize; i++) {
    int sendRank = (myRank + i) % worldSize;
    int recvRank = (myRank + worldSize - i) % worldSize;
    in->send(
        sendRank, slot, inOffsetPerRank[sendRank], inLengthPerRank[sendRank]);
    out->recv(
        recvRank, slot, outOffsetPerRank[recvRank], outLengthPerRank[recvRank]);
  }

  for (int i = 1; i < worldSize; i++) {
    in->waitSend(opts.timeout);
    out->waitRecv(opts.timeout);
  }
}
"""

ALLGATHERV = """\
  for (auto i = 0; i < context->size - 1; i++) {
    const size_t sendIndex = (baseIndex - i) % context->size;
    const size_t recvIndex = (baseIndex - i - 1) % context->size;

    if (i == 0) {
      out->send(sendRank, slot, byteOffsets[sendIndex], byteCounts[sendIndex]);
      out->recv(recvRank, slot, byteOffsets[recvIndex], byteCounts[recvIndex]);
      continue;
    }

    // Wait for previous operations to complete before kicking off new ones.
    out->waitSend(opts.timeout);
    out->waitRecv(opts.timeout);
    out->send(sendRank, slot, byteOffsets[sendIndex], byteCounts[sendIndex]);
    out->recv(recvRank, slot, byteOffsets[recvIndex], byteCounts[recvIndex]);
  }
"""


def calls(text: str) -> list[str]:
    """The posting calls in order: 'send' or 'recv' (waits not included)."""
    out = []
    for line in text.splitlines():
        if "->send(" in line:
            out.append("send")
        elif "->recv(" in line:
            out.append("recv")
    return out


def test_alltoallv_posts_every_receive_before_any_send():
    patched = patch_gloo.alltoallv(ALLTOALLV)
    assert calls(ALLTOALLV) == ["send", "recv"]
    assert calls(patched) == ["recv", "send"]
    # Each loop still walks every peer with its own ranks, and the waits are untouched.
    assert patched.count("for (int i = 1; i < worldSize; i++) {") == 3
    assert patched.count("int recvRank = (myRank + worldSize - i) % worldSize;") == 2
    assert patched.endswith("    in->waitSend(opts.timeout);\n    out->waitRecv(opts.timeout);\n  }\n}\n")


def test_allgatherv_posts_the_receive_first_in_every_step():
    patched = patch_gloo.allgatherv(ALLGATHERV)
    assert calls(ALLGATHERV) == ["send", "recv", "send", "recv"]
    assert calls(patched) == ["recv", "send", "recv", "send"]
    assert sorted(patched.splitlines()) == sorted(ALLGATHERV.splitlines())  # reordered, nothing else


@pytest.mark.parametrize("fix, text, expected", [
    (patch_gloo.alltoallv, ALLTOALLV.replace("in->send(", "in->isend("),
     "alltoallv.cc: expected the remote-copy loop once, found it 0 times"),
    (patch_gloo.alltoallv, patch_gloo.alltoallv(ALLTOALLV), "found it 0 times"),  # patched already
    (patch_gloo.allgatherv, patch_gloo.allgatherv(ALLGATHERV),
     "allgatherv.cc: expected the send/recv pair indented 6 once, found it 0 times"),
    (patch_gloo.allgatherv, ALLGATHERV + ALLGATHERV, "found it 2 times"),
])
def test_another_source_is_refused(fix, text, expected):
    with pytest.raises(patch_gloo.SourceChanged, match=expected):
        fix(text)


def test_main_patches_both_files_or_neither(tmp_path, capsys):
    (tmp_path / "alltoallv.cc").write_text(ALLTOALLV)
    (tmp_path / "allgatherv.cc").write_text(ALLGATHERV)
    assert patch_gloo.main([str(tmp_path)]) == 0
    assert calls((tmp_path / "alltoallv.cc").read_text()) == ["recv", "send"]
    assert calls((tmp_path / "allgatherv.cc").read_text()) == ["recv", "send", "recv", "send"]

    # A second run finds patched sources: it fails, names the file, and writes nothing.
    (tmp_path / "alltoallv.cc").write_text(ALLTOALLV)
    before = (tmp_path / "allgatherv.cc").read_text()
    assert patch_gloo.main([str(tmp_path)]) == 1
    assert "allgatherv.cc: expected the send/recv pair" in capsys.readouterr().err
    assert (tmp_path / "alltoallv.cc").read_text() == ALLTOALLV
    assert (tmp_path / "allgatherv.cc").read_text() == before


def test_main_reports_a_missing_source_and_bad_usage(tmp_path, capsys):
    assert patch_gloo.main([str(tmp_path / "nowhere")]) == 1
    assert "alltoallv.cc" in capsys.readouterr().err
    assert patch_gloo.main([]) == 2
    assert "usage: patch_gloo.py GLOO_SOURCE_DIR" in capsys.readouterr().err
