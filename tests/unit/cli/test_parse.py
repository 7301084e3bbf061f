"""hvdkeras.cli.parse: the `hvdkeras run` command line, parsed and checked; each error says what was received."""

import subprocess
import sys

import pytest

from hvdkeras import wrap
from hvdkeras.cli import command
from hvdkeras.cli import parse as cli

from . import config


def test_script_options_after_the_script_go_to_the_script():
    cfg = config("-np", "2", "t.py", "--lr-scaling", "none")
    assert cfg.script_args == ("--lr-scaling", "none") and cfg.forwarded == ()


@pytest.mark.parametrize(
    "argv, kwargs, match",
    [
        (("-np", "0", "t.py"), {}, r"-np must be an integer >= 1. Received: -np 0"),
        (("-np", "2", "missing.py"), {"isfile": lambda p: False}, "Received: script='missing.py'"),
        (("-np", "2", "-H", "a:x", "t.py"), {}, "Received: -H 'a:x'"),
        (("-np", "2", "-H", "a:0", "t.py"), {}, "Received: -H 'a:0'"),
        (("-np", "2", "-H", "a", "t.py"), {}, "Received: -H 'a'"),
        (("-np", "3", "-H", "a:1,b:1", "t.py"), {}, "offers 2 slots for -np 3"),
        (("-np", "2", "--backward-passes-per-step", "0", "t.py"), {}, "backward-passes-per-step 0"),
        (("-np", "2", "--warmup-epochs", "-1", "t.py"), {}, "warmup-epochs -1"),
        (("-np", "2", "t.py"), {"which": lambda name: None}, "horovodrun was not found"),
        (("-np", "2", "--min-np", "1", "t.py"), {"isfile": lambda p: p == "t.py"}, "host-discovery-script"),
        (("-np", "2", "--blacklist-cooldown-range", "1", "9", "t.py"), {"isfile": lambda p: p == "t.py"},
         "host-discovery-script"),
        (("-np", "2", "--host-discovery-script", "d.sh", "--blacklist-cooldown-range", "0", "9", "t.py"), {},
         r"1 <= MIN <= MAX <= 3600. Received: --blacklist-cooldown-range 0 9"),
        (("-np", "2", "--host-discovery-script", "d.sh", "--blacklist-cooldown-range", "9", "5", "t.py"), {},
         r"Received: --blacklist-cooldown-range 9 5"),
        (("-np", "2", "--host-discovery-script", "d.sh", "--blacklist-cooldown-range", "1", "4000", "t.py"), {},
         r"Received: --blacklist-cooldown-range 1 4000"),
        # oversized, and numbers no timer or process table takes
        (("-np", str(10 ** 26), "t.py"), {}, r"-np must be an integer from 1 to 65536. Received: -np 1000"),
        (("-np", "2", "--stall-timeout", "1e400", "t.py"), {},
         r"--stall-timeout must be a number of seconds > 0. Received: --stall-timeout inf"),
        (("-np", "2", "--stall-timeout", "nan", "t.py"), {}, r"Received: --stall-timeout nan"),
        (("-np", "2", "--warmup-epochs", "1e30", "t.py"), {}, r"at most 2\*\*63 - 1. Received: --warmup-epochs 1e\+30"),
        (("-np", "2", "-H", "a:1," * 3000, "t.py"), {}, r"Received: -H 'a:1,a:1,.*\.\.\. \(12002 characters\)$"),
        (("-np", "2", "x" * 5000), {"isfile": lambda p: False}, r"Received: script='xxx.*\.\.\. \(5002 characters\)$"),
        # --reducer: a name, its options, and combinations that cannot work
        (("-np", "2", "--reducer", "topk", "t.py"), {},
         r"--reducer must be a reducer, .* that names a reducer: one of allreduce, .*Received: --reducer topk"),
        (("-np", "2", "--reducer", "powersgd:ranks=2", "t.py"), {},
         r"does not take \('ranks'\); powersgd takes rank, start_step"),
        (("-np", "2", "--reducer", "local_sgd", "t.py"), {}, r"gives local_sgd its period"),
        (("-np", "2", "--reducer", "diloco:period=x", "t.py"), {}, r"gives diloco's period an integer"),
        (("-np", "2", "--reducer", "powersgd:rank=2", "--shard-optimizer-state", "t.py"), {},
         r"--reducer powersgd cannot be combined with --shard-optimizer-state"),
    ],
)
def test_validation_errors(argv, kwargs, match):
    with pytest.raises(cli.UsageError, match=match):
        config(*argv, **kwargs)


def test_the_reducer_flag_is_forwarded_and_read_from_the_environment(monkeypatch):
    cfg = config("-np", "2", "--reducer", "powersgd:rank=4,start_step=100", "t.py")
    assert "--reducer" in cfg.forwarded and "powersgd:rank=4,start_step=100" in cfg.forwarded
    monkeypatch.setenv("HVDKERAS_REDUCER", "local_sgd:period=8")
    with pytest.raises(cli.UsageError, match="--reducer local_sgd cannot be combined"):
        config("-np", "2", "--shard-optimizer-state", "t.py")
    with pytest.raises(ValueError, match="--reducer diloco cannot be combined"):
        wrap.Options(reducer="diloco:period=4", shard_optimizer_state=True)


def test_main_exits_2_without_starting_anything(tmp_path, capsys):
    assert cli.main(["run", "-np", "2", str(tmp_path / "nope.py")]) == cli.EXIT_USAGE
    assert "Received: script=" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_options_from_environment():
    env = {"HVDKERAS_LR_SCALING": "sqrt", "HVDKERAS_WARMUP_EPOCHS": "3", "HVDKERAS_FP16_ALLREDUCE": "1",
           "HVDKERAS_BACKWARD_PASSES_PER_STEP": "2", "HVDKERAS_NO_SHARD": "false"}
    opts = wrap.Options(**wrap.options_from_env(env))
    assert opts == wrap.Options(lr_scaling="sqrt", warmup_epochs=3, fp16_allreduce=True,
                                backward_passes_per_step=2, no_shard=False)
    with pytest.raises(ValueError, match="Received: HVDKERAS_NO_SHARD='maybe'"):
        wrap.options_from_env({"HVDKERAS_NO_SHARD": "maybe"})
    with pytest.raises(ValueError, match="Received: HVDKERAS_LR_SCALING='cubic'"):
        wrap.Options(**wrap.options_from_env({"HVDKERAS_LR_SCALING": "cubic"}))


@pytest.mark.parametrize("argv, message", [
    (("t.py",), "-np is required"),
    (("--nnodes", "0", "t.py"), "--nnodes must be an integer >= 1. Received: --nnodes 0"),
    (("--nnodes", "2", "--master-addr", "a", "t.py"), "--node-rank is required with --nnodes 2"),
    (("--nnodes", "2", "--node-rank", "2", "--master-addr", "a", "t.py"), "Received: --node-rank 2"),
    (("--nnodes", "2", "--node-rank", "0", "t.py"), "--master-addr is required"),
    (("--nnodes", "2", "--node-rank", "0", "--master-addr", "a", "--master-port", "0", "t.py"),
     "Received: --master-port 0"),
    (("--nnodes", "2", "--node-rank", "0", "--master-addr", "a", "-np", "3", "t.py"), "Received: -np 3"),
    (("--nnodes", "1", "--nproc-per-node", "0", "t.py"), "Received: --nproc-per-node 0"),
    (("--node-rank", "1", "-np", "2", "t.py"), "need --nnodes"),
    (("--nnodes", "1", "-H", "a:1", "t.py"), "takes no -H"),
])
def test_bad_multi_node_options(argv, message):
    with pytest.raises(cli.UsageError) as err:
        config(*argv)
    assert message in str(err.value)


@pytest.mark.parametrize("raw", ["soon", "0", "-5"])
def test_bad_stall_timeout_from_the_environment(monkeypatch, raw):
    monkeypatch.setenv("HVDKERAS_STALL_TIMEOUT", raw)
    with pytest.raises(cli.UsageError, match=f"HVDKERAS_STALL_TIMEOUT must be a number of seconds > 0. "
                                             f"Received: HVDKERAS_STALL_TIMEOUT='{raw}'"):
        config("-np", "2", "t.py")


@pytest.mark.parametrize("value, kept", [(None, False), ("0", False), ("1", True), ("on", True)])
def test_tensorflows_startup_lines_are_left_out_unless_the_variable_says(monkeypatch, value, kept):
    if value is None:
        monkeypatch.delenv("HVDKERAS_TF_STARTUP_LOG", raising=False)
    else:
        monkeypatch.setenv("HVDKERAS_TF_STARTUP_LOG", value)
    assert config("-np", "2", "t.py").startup_log is kept
    assert config("--nnodes", "1", "t.py").startup_log is kept
    monkeypatch.setenv("HVDKERAS_TF_STARTUP_LOG", "loud")
    with pytest.raises(cli.UsageError, match="HVDKERAS_TF_STARTUP_LOG must be one of 1/0/true/false/yes/no/on/off. "
                                             "Received: HVDKERAS_TF_STARTUP_LOG='loud'"):
        config("-np", "2", "t.py")


def test_the_hvdkeras_command_starts_without_tensorflow():

    code = ("import sys, hvdkeras, hvdkeras.cli.parse, hvdkeras.cli.command, hvdkeras.cli.supervise\n"
            "import hvdkeras.cli.startup_log\n"
            "import hvdkeras.job.launchers\n"
            "hvdkeras.cli.parse.build_parser()\n"
            "print(sorted(m for m in ('tensorflow', 'keras', 'horovod') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_stall_timeout_option():
    ns = cli.build_parser().parse_args(["run", "-np", "2", "--stall-timeout", "0", "t.py"])
    with pytest.raises(cli.UsageError, match="Received: --stall-timeout 0"):
        cli.validate(ns, isfile=lambda p: True, which=lambda n: "/bin/horovodrun", python="/x/python")
    ns = cli.build_parser().parse_args(["run", "-np", "2", "t.py"])
    cfg = cli.validate(ns, isfile=lambda p: True, which=lambda n: "/bin/horovodrun", python="/x/python")
    assert command.build_command(cfg)[1]["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "60"
