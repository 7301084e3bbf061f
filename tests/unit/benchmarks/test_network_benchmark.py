"""The network benchmark's own arithmetic and its refusal to report a link that is not what it asked for."""


import json

import pytest

from . import load

nb = load("network_benchmark")


@pytest.mark.parametrize("text, bits", [("1gbit", 1e9), ("200mbit", 2e8), ("50mbit", 5e7), ("2.5Mbit", 2.5e6),
                                        ("500kbit", 5e5)])
def test_rates_are_read_as_tc_writes_them(text, bits):
    assert nb.parse_rate(text) == bits


@pytest.mark.parametrize("text", ["fast", "100", "100mb", "-1mbit"])
def test_a_bad_rate_says_what_was_received(text):
    with pytest.raises(Exception, match=f"kbit, mbit or gbit.*Received: {text!r}"):
        nb.parse_rate(text)


def test_a_link_is_reported_only_when_it_runs_near_the_nominal_rate():
    # 2.5 MB at 200 Mbit/s is 100 ms once each way on a 2-worker ring.
    ok = nb.check_link("200mbit", 2e8, 2_500_000, 110.0)
    assert ok["allreduce_mbit_s"] == pytest.approx(181.8, rel=1e-3)
    with pytest.raises(nb.LinkError, match=r"asked for 200mbit, but .* 1000 Mbit/s \(5.00x"):
        nb.check_link("200mbit", 2e8, 2_500_000, 20.0)  # shaping not in effect
    with pytest.raises(nb.LinkError, match=r"0.20x the nominal rate"):
        nb.check_link("200mbit", 2e8, 2_500_000, 500.0)  # something else is the limit


def test_overlap_and_efficiency_follow_their_definitions():
    d = nb.derive(t_step=120.0, t_local=100.0, t_comm=50.0, t_forward=20.0)
    assert d["no_overlap_ms"] == 150.0 and d["perfect_overlap_ms"] == 100.0
    assert d["overlap"] == pytest.approx(0.6)  # 30 of the 50 ms of communication hidden
    assert d["scaling_efficiency"] == pytest.approx(100 / 120)
    assert nb.derive(150.0, 100.0, 50.0, 20.0)["overlap"] == pytest.approx(0.0)
    assert nb.derive(100.0, 100.0, 50.0, 20.0)["overlap"] == pytest.approx(1.0)


def test_overlap_after_the_forward_pass_is_measured_against_that_bound():
    # Communication about as long as compute: no gradient before the forward pass ends (20 ms), so the best step
    # is 20 + 100 = 120 ms, not max(t_local, t_comm) = 100 ms.
    d = nb.derive(t_step=140.0, t_local=100.0, t_comm=100.0, t_forward=20.0)
    assert d["after_forward_bound_ms"] == 120.0 and d["perfect_overlap_ms"] == 100.0
    assert d["overlap"] == pytest.approx(0.6)  # 60 of the 100 hideable ms
    assert d["overlap_after_forward"] == pytest.approx(0.75)  # 60 of the 80 ms that can be hidden after it
    assert d["vs_after_forward_bound"] == pytest.approx(140 / 120 - 1)
    assert nb.derive(120.0, 100.0, 100.0, 20.0)["overlap_after_forward"] == pytest.approx(1.0)
    # Compute-bound: the bound is t_local, and both overlaps agree.
    d = nb.derive(t_step=110.0, t_local=100.0, t_comm=30.0, t_forward=20.0)
    assert d["after_forward_bound_ms"] == 100.0 and d["overlap_after_forward"] == pytest.approx(d["overlap"])


def test_the_cpu_floor_bounds_the_step_where_compute_fills_the_cores():
    # Each worker's compute takes its core for 48 ms and the allreduce's own work 16 ms more: no overlap can
    # make the step shorter than 64 ms, although the after-forward bound is 56 ms.
    d = nb.derive(t_step=72.0, t_local=48.0, t_comm=42.0, t_forward=14.0, cpu_floor=64.0)
    assert d["after_forward_bound_ms"] == 56.0 and d["reachable_bound_ms"] == 64.0
    assert d["vs_reachable_bound"] == pytest.approx(72 / 64 - 1)
    assert d["vs_after_forward_bound"] == pytest.approx(72 / 56 - 1)
    # Where the cores have room (a floor under the after-forward bound), the after-forward bound is the one.
    d = nb.derive(t_step=140.0, t_local=100.0, t_comm=100.0, t_forward=20.0, cpu_floor=90.0)
    assert d["reachable_bound_ms"] == 120.0 and d["vs_reachable_bound"] == pytest.approx(d["vs_after_forward_bound"])


def test_summarize_takes_the_cpu_floor_from_the_local_step_and_the_allreduce():
    def t(ms, cpu):
        return {"median_ms": ms, "min_ms": ms, "max_ms": ms, "rounds_ms": [ms], "cpu_ms": cpu, "wait_ms": 1.0}

    k3 = {"local": t(48, 47), "comm": t(42, 16), "comm_fp16": t(34, 25), "link": t(40, 15), "forward": t(14, 13),
          **{v: t(72, 60) for v in nb.KERAS3_VARIANTS}}
    k2 = {"local": t(50, 45), "horovod_keras2": t(75, 61)}
    s = nb.summarize(k3, k2, 3_000_000)
    assert (s["cpu_local_ms"], s["cpu_comm_ms"], s["cpu_floor_ms"]) == (47, 16, 63)
    assert s["variants"]["hvdkeras"]["reachable_bound_ms"] == 63
    assert s["variants"]["hvdkeras_fp16"]["reachable_bound_ms"] == 47 + 25  # its own allreduce's CPU
    assert s["variants"]["horovod_keras2"]["reachable_bound_ms"] == 45 + 16  # against tf-keras's own step


    # Device-like compute: no tf-keras run, and every other figure as before.
    device = nb.summarize(k3, None, 3_000_000)
    assert "horovod_keras2" not in device["variants"] and device["t_local_keras2_ms"] is None
    assert device["variants"]["hvdkeras"] == s["variants"]["hvdkeras"]


def test_nice_settings_are_read_in_order():
    assert nb.parse_nice(None, "default,none,-5") == ["default", "none", "-5"]
    assert nb.threads_label(1, "none") == "1 inter-op thread, HVDKERAS_HOROVOD_NICE=none"
    assert nb.threads_label(0) == "default inter-op threads"


@pytest.mark.parametrize("option, value, expected", [
    *[("--inter-op", v, "--inter-op takes distinct integers >= 0") for v in ["", "one", "1,1", "-1"]],
    *[("--nice", v, "--nice takes distinct settings") for v in ["", "nice", "default,default", "-21", "20"]],
    ("--competing", "-1", "--competing takes a count >= 0")])
def test_a_bad_setting_says_what_was_received(option, value, expected, capsys):
    with pytest.raises(SystemExit):
        nb.main([option, value])
    err = capsys.readouterr().err
    assert expected in err and f"Received: {value if option == '--competing' else repr(value)}" in err


def test_rounds_take_the_slower_rank_then_the_median():
    ranks = [{"models": {"m": {"rounds_s": {"v": [0.10, 0.30, 0.20]}, "cpu_rounds_s": {"v": [0.1, 0.2, 0.3]},
                               "wait_rounds_s": {"v": [0.01, 0.02, 0.05]}}}},
             {"models": {"m": {"rounds_s": {"v": [0.12, 0.25, 0.21]}, "cpu_rounds_s": {"v": [0.3, 0.2, 0.1]},
                               "wait_rounds_s": {"v": [0.03, 0.00, 0.01]}}}}]
    out = nb.combine(ranks, "m")["v"]
    assert out["rounds_ms"] == pytest.approx([120, 300, 210])
    assert out["median_ms"] == pytest.approx(210) and out["min_ms"] == pytest.approx(120)
    assert out["cpu_ms"] == pytest.approx(200)  # the ranks' mean per round, then the median
    assert out["wait_ms"] == pytest.approx(20)  # means 20, 10, 30 ms


def test_a_worker_reads_its_threads_waiting_for_a_core():
    net_worker = load("net_worker")  # it imports TensorFlow and benchmarks/peer_loops.py

    cpu, waited = net_worker.usage()
    assert cpu > 0 and waited >= 0
    marks = [(1.0, 0.5), (1.5, 0.6), (2.0, 0.9)]
    assert net_worker.per_step(marks, 2) == (pytest.approx(0.5), pytest.approx(0.2))


def test_a_bad_rate_on_the_command_line_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        nb.main(["--rates", "1gbit,fast"])
    err = capsys.readouterr().err
    assert "error: a link rate is a number and kbit, mbit or gbit" in err and "Received: 'fast'" in err


def test_the_first_bucket_bound_starts_communication_when_that_bucket_exists():
    # The first bucket's gradients exist 5 ms after the forward pass: the best step is 25 + 100 ms.
    d = nb.derive(t_step=130.0, t_local=100.0, t_comm=100.0, t_forward=20.0, t_first=25.0)
    assert d["after_forward_bound_ms"] == 120.0 and d["after_first_bucket_bound_ms"] == 125.0
    assert d["vs_after_first_bucket_bound"] == pytest.approx(130 / 125 - 1)
    assert nb.derive(110.0, 100.0, 30.0, 20.0, t_first=25.0)["after_first_bucket_bound_ms"] == 100.0  # compute-bound
    assert "after_first_bucket_bound_ms" not in nb.derive(130.0, 100.0, 100.0, 20.0)


def test_each_variant_is_compared_with_the_tape_loop_round_by_round():
    def t(rounds):
        return {"median_ms": sorted(rounds)[1], "min_ms": min(rounds), "max_ms": max(rounds), "rounds_ms": rounds,
                "cpu_ms": 1.0, "wait_ms": 1.0}

    k3 = {"local": t([48, 50, 49]), "comm": t([42, 42, 42]), "comm_fp16": t([30, 30, 30]), "link": t([40, 40, 40]),
          "forward": t([14, 14, 14]), **{v: t([70, 90, 80]) for v in nb.KERAS3_VARIANTS}}
    k3["horovod_tape"] = t([69, 88, 81])  # the machine slowed in the second round for both
    k3["hvdkeras"] = t([71, 91, 80])
    s = nb.summarize(k3, None, 3_000_000)
    # The medians are 80 and 81 ms, but hvdkeras was slower in two rounds of three: differences 2, 3 and -1 ms.
    assert s["variants"]["hvdkeras"]["vs_tape_paired_ms"] == 2
    assert s["variants"]["horovod_tape"]["vs_tape_paired_ms"] == 0


def test_each_round_starts_one_variant_further_on():
    net_worker = load("net_worker")
    order = []

    def runner(name):
        def run(steps):
            order.append(name)
            return 0.1, 0.0, 0.0
        return run

    wall, _, _ = net_worker.measure({n: runner(n) for n in "abc"}, steps=2, rounds=4, warmup=1)
    assert order == [*"abc", *"abc", *"bca", *"cab", *"abc"]  # the warm-up, then the 4 rounds
    assert wall == {n: [0.1] * 4 for n in "abc"}


def test_the_first_bucket_is_the_last_layers_up_to_the_bucket_size():
    net_worker = load("net_worker")
    import keras

    model = net_worker.conv_model(keras)
    shapes = [tuple(model.trainable_variables[i].shape) for i in net_worker.first_bucket(model.trainable_variables)]
    # The classifier (6.4 KB) is under the 64 KiB default, so the bucket takes the last conv layer too (737 KB).
    assert shapes == [(10,), (160, 10), (160,), (3, 3, 128, 160)]


def test_a_run_can_wait_an_earlier_runs_calibration(tmp_path, capsys):
    layers = [{"name": "conv2d", "forward_s": 0.002, "backward_s": 0.003, "shapes": [[3, 3, 3, 32], [32]]}]
    earlier = tmp_path / "network_device.json"
    earlier.write_text(json.dumps({"runs": [{"inter_op": 4, "calibration": {"conv": layers}}]}))
    assert nb.read_calibration(None, earlier) == {"conv": layers}

    for bad in ({"runs": []}, {"conv": layers}, {"runs": [{"calibration": {"conv": [{"name": "x"}]}}]}):
        earlier.write_text(json.dumps(bad))
        with pytest.raises(SystemExit):
            nb.main(["--compute", "device", "--calibration", str(earlier)])
        assert f"Received: {str(earlier)!r}, which is not one" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        nb.main(["--calibration", str(earlier)])
    assert "--calibration is for --compute device. Received: --compute cpu" in capsys.readouterr().err
