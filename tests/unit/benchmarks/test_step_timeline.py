"""The one-step timeline's reading of Horovod's timeline and of the workers' profiled ops, on a recorded step."""

import json
from pathlib import Path

import pytest

from . import load

st = load("step_timeline")

START_US = 1_000_000_000_000  # Horovod's start_time_since_epoch_in_micros


def write_rank0(folder: Path, unterminated: bool) -> None:
    # Two tensors of bucket 1 (grouped: _1of2, _2of2) and one of bucket 0, as Horovod 0.28.1 writes them:
    # one "process" per tensor, nested B/E spans, possibly no closing bracket while it still runs.
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": START_US}},
              {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "hvdkeras.gradients.1_1of2"}},
              {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "hvdkeras.gradients.1_2of2"}},
              {"name": "process_name", "ph": "M", "pid": 3, "args": {"name": "hvdkeras.gradients.0"}},
              {"ph": "i", "name": "CYCLE_START", "ts": 1000, "s": "g"}]
    for pid, negotiate, transfer in ((1, (10_000, 14_000), (15_000, 30_000)), (2, (11_000, 14_000), (15_000, 31_000)),
                                     (3, (5_000, 8_000), (8_500, 9_500))):
        events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": negotiate[0], "pid": pid},
                   {"ph": "E", "ts": negotiate[1], "pid": pid},
                   {"ph": "B", "name": "ALLREDUCE", "ts": transfer[0] - 100, "pid": pid},
                   {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": transfer[0], "pid": pid},
                   {"ph": "E", "ts": transfer[1], "pid": pid},
                   {"ph": "E", "ts": transfer[1] + 100, "pid": pid}]
    text = "[\n" + ",\n".join(json.dumps(e) for e in events) + ("," if unterminated else "\n]")
    (folder / "timeline.rank0.horovod.json").write_text(text)


def write_record(folder: Path, rank: int, late_ms: float = 0.0) -> None:
    # The profiled ops of one step: the forward pass, the ops that produce each bucket's gradients (bucket 1's
    # last one ends at 9 ms), each bucket's allreduce kernel (its start, then its done callback) and one op of
    # a later step, which is not read. `late_ms` delays bucket 0's gradients and kernel (a slower rank).
    t0 = START_US / 1e6

    def op(name, kind, begin_ms, end_ms):
        return [name, kind, t0 + begin_ms / 1e3, t0 + end_ms / 1e3]

    ops = [op("sequential/conv2d/Relu", "_MklNativeFusedConv2D", 0.5, 3.5),
           op("gradient_tape/sequential/dense/MatMul/MatMul_1", "_MklMatMul", 4.0 + late_ms, 4.5 + late_ms),
           op("gradient_tape/sequential/conv2d_1/Conv2DBackpropFilter", "_MklNativeConv2DBackpropFilterWithBias",
              6.0, 8.0),
           op("gradient_tape/sequential/conv2d/Conv2DBackpropFilter", "_MklNativeConv2DBackpropFilterWithBias",
              8.0, 9.0),
           op("distributed_sgd/hvdkeras.gradients.0", "HorovodGroupedAllreduce", 4.6 + late_ms, 4.7 + late_ms),
           op("distributed_sgd/hvdkeras.gradients.1", "HorovodGroupedAllreduce", 9.1, 9.2),
           op("distributed_sgd/hvdkeras.gradients.0", "HorovodGroupedAllreduce.done", 10.0, 10.1),
           op("distributed_sgd/hvdkeras.gradients.1", "HorovodGroupedAllreduce.done", 32.0, 32.1),
           op("gradient_tape/sequential/conv2d/Conv2DBackpropFilter", "_MklNativeConv2DBackpropFilterWithBias",
              9000.0, 9001.0)]
    buckets = {"hvdkeras.gradients.0": ["gradient_tape/sequential/dense/MatMul/MatMul_1"],
               "hvdkeras.gradients.1": ["gradient_tape/sequential/conv2d_1/Conv2DBackpropFilter",
                                        "gradient_tape/sequential/conv2d/Conv2DBackpropFilter"]}
    (folder / f"timeline.rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "step_begin": [t0], "step_end": [t0 + 0.035], "bucket_ops": buckets, "ops": ops}))


def test_a_step_reads_every_bucket_on_one_clock(tmp_path):
    write_rank0(tmp_path, unterminated=True)
    write_record(tmp_path, 0)
    write_record(tmp_path, 1)
    [step] = st.one_rank(tmp_path, 0)
    assert list(step["buckets"]) == ["hvdkeras.gradients.0", "hvdkeras.gradients.1"]  # in the order grads came
    ms = {name: {k: round((v - step["begin"]) * 1e3, 3) for k, v in row.items()}
          for name, row in step["buckets"].items()}
    assert ms["hvdkeras.gradients.1"] == {"grad_ready": 9.0, "enqueued": 9.1, "negotiation_begin": 10.0,
                                          "negotiation_end": 14.0, "transfer_begin": 15.0, "transfer_end": 31.0,
                                          "reduced": 32.0}
    assert ms["hvdkeras.gradients.0"]["transfer_end"] == 9.5  # an op outside the step (t0 + 9 s) is not read
    assert round((step["backward_begin"] - step["begin"]) * 1e3, 3) == 4.0
    [other] = st.one_rank(tmp_path, 1)  # Horovod writes its timeline on rank 0 only
    assert set(other["buckets"]["hvdkeras.gradients.1"]) == {"grad_ready", "enqueued", "reduced"}
    table = st.table(step)
    assert "step 35.0 ms; backward pass begins at     4.0" in table
    assert table.splitlines()[-1].split() == ["hvdkeras.gradients.1", "9.0", "9.1", "10.0", "14.0", "15.0", "31.0",
                                              "32.0"]
    shares = st.breakdown(step, other)  # eight consecutive shares of the 35 ms step
    assert {k: round(v, 3) for k, v in shares.items()} == {
        "forward": 4.0, "until_first_gradients": 0.5, "until_first_enqueue": 0.1, "waiting_for_the_other_rank": 0.0,
        "negotiation": 3.9, "transfers": 17.0, "link_idle_between": 5.5, "tail": 4.0}
    assert round(sum(shares.values()), 3) == 35.0
    assert st.breakdown(step) == shares  # the other rank enqueued bucket 0 at the same instant
    del step["buckets"]["hvdkeras.gradients.0"]["grad_ready"]  # its producing ops fused into others
    shares = st.breakdown(step)  # bucket 0's kernel start (4.6 ms) stands in for its gradients
    assert (round(shares["until_first_gradients"], 3), round(shares["until_first_enqueue"], 3)) == (0.6, 0.0)


def test_a_slower_rank_is_waited_for_before_negotiation_can_end(tmp_path):
    write_rank0(tmp_path, unterminated=False)
    write_record(tmp_path, 0)
    write_record(tmp_path, 1, late_ms=1.4)  # rank 1 enqueues bucket 0 at 6.0 ms; rank 0 did at 4.6
    [step], [other] = st.one_rank(tmp_path, 0), st.one_rank(tmp_path, 1)
    shares = st.breakdown(step, other)
    # Bucket 0 is on both ranks at 6.0 ms, and its transfer begins at 8.5 ms.
    assert (round(shares["waiting_for_the_other_rank"], 3), round(shares["negotiation"], 3)) == (1.4, 2.5)
    assert round(sum(shares.values()), 3) == 35.0
    write_record(tmp_path, 1, late_ms=20.0)  # bucket 0 after the transfer began: the wait ends at the transfer
    shares = st.breakdown(step, st.one_rank(tmp_path, 1)[0])
    assert (round(shares["waiting_for_the_other_rank"], 3), round(shares["negotiation"], 3)) == (3.9, 0.0)


def test_the_figure_shows_one_panel_per_threading_setting(tmp_path):
    write_rank0(tmp_path, unterminated=False)
    write_record(tmp_path, 0)
    [step] = st.one_rank(tmp_path, 0)
    assert st.median_step([step]) is step
    runs = [{"rate": "200mbit", "inter_op": inter_op, "ranks": [[step], []], "step_ms": 35.0,
             "breakdown_ms": st.breakdown(step)} for inter_op in (1, 0)]
    st.plot(runs, tmp_path / "step.png")
    from PIL import Image

    with Image.open(tmp_path / "step.png") as image:
        width, height = image.size
    assert width > 800 and height > 2 * 200  # two panels, one above the other


@pytest.mark.parametrize("argv, expected", [(["--inter-op", "one"], "--inter-op takes distinct integers >= 0"),
                                            (["--rates", "fast"], "kbit, mbit or gbit")])
def test_bad_options_are_usage_errors_before_any_host_is_made(argv, expected, capsys):
    with pytest.raises(SystemExit):
        st.main(argv)
    assert expected in capsys.readouterr().err
