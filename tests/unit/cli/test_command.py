"""hvdkeras.cli.command: the pure horovodrun command and the ssh-less node's workers, built from a checked RunConfig."""

from hvdkeras.cli import command

from . import config


def test_build_command_defaults_to_gloo_on_localhost():
    argv, env = command.build_command(config("-np", "2", "train.py", "--epochs", "3"))
    assert argv == ["/usr/bin/horovodrun", "-np", "2", "-H", "localhost:2", "--gloo",
                    "/venv/bin/python", "-m", "hvdkeras", "--", "train.py", "--epochs", "3"]
    assert env == {"PYTHONUNBUFFERED": "1", "HOROVOD_GLOO_TIMEOUT_SECONDS": "60"}


def test_build_command_forwards_training_options_and_hosts():
    cfg = config("-np", "4", "-H", "a:2,b:2", "--lr-scaling", "sqrt", "--warmup-epochs", "2.5",
                 "--fp16-allreduce", "--backward-passes-per-step", "2", "--no-shard", "--mpi", "t.py")
    argv, _ = command.build_command(cfg)
    assert argv[:6] == ["/usr/bin/horovodrun", "-np", "4", "-H", "a:2,b:2", "--mpi"]
    assert argv[6:] == ["/venv/bin/python", "-m", "hvdkeras", "--lr-scaling", "sqrt", "--warmup-epochs", "2.5",
                        "--fp16-allreduce", "--backward-passes-per-step", "2", "--no-shard", "--", "t.py"]


def test_build_command_elastic():
    cfg = config("-np", "2", "--min-np", "1", "--max-np", "3", "--host-discovery-script", "d.sh", "t.py")
    argv, _ = command.build_command(cfg)
    assert argv[:9] == ["/usr/bin/horovodrun", "-np", "2", "--min-np", "1", "--max-np", "3",
                        "--host-discovery-script", "d.sh"]
    # A host whose worker failed may come back (horovodrun alone would keep it out for good).
    assert argv[9:12] == ["--blacklist-cooldown-range", "1", "60"]
    assert "-H" not in argv


def test_build_command_elastic_cooldown_range_is_passed_on():
    cfg = config("-np", "2", "--min-np", "1", "--host-discovery-script", "d.sh", "--blacklist-cooldown-range",
                 "5", "300", "t.py")
    argv, _ = command.build_command(cfg)
    at = argv.index("--blacklist-cooldown-range")
    assert argv[at + 1:at + 3] == ["5", "300"]
    assert "--blacklist-cooldown-range" not in command.build_command(config("-np", "2", "t.py"))[0]


def test_node_workers_carry_the_torchrun_variables():
    cfg = config("--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr", "node0",
                 "--master-port", "29400", "--job-id", "exp", "--fp16-allreduce", "t.py", "--epochs", "2")
    assert cfg.np == 4
    workers = command.build_node_workers(cfg)
    assert [w[0] for w in workers] == [["/venv/bin/python", "-m", "hvdkeras", "--fp16-allreduce", "t.py",
                                        "--epochs", "2"]] * 2
    assert [(e["RANK"], e["LOCAL_RANK"]) for _, e in workers] == [("2", "0"), ("3", "1")]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"], e["HVDKERAS_JOB_ID"])
            for _, e in workers} == {("4", "2", "node0", "29400", "exp")}


def test_single_node_form_defaults():
    cfg = config("--nnodes", "1", "t.py")
    (argv, env), = command.build_node_workers(cfg)
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == \
        ("0", "1", "127.0.0.1", str(command.DEFAULT_MASTER_PORT))
    assert "HVDKERAS_JOB_ID" not in env


def test_script_options_reach_the_script_through_horovodruns_parser(monkeypatch):
    """A script option that abbreviates two of horovodrun's (--log) or two of hvdkeras's (--m) or is one of
    theirs (-np, --verbose) is the script's: horovodrun's own parser hands the command over unchanged."""
    from horovod.runner import launch

    script_args = ["--log", "x.log", "--m", "3", "-np", "7", "--verbose", "--", "tail"]
    cfg = config("-np", "2", "--fp16-allreduce", "t.py", *script_args)
    assert cfg.script_args == tuple(script_args)
    argv, _ = command.build_command(cfg)
    monkeypatch.setattr("sys.argv", ["horovodrun", *argv[1:]])
    parsed = launch.parse_args()
    assert parsed.num_proc == 2 and not parsed.verbose
    assert parsed.command == ["/venv/bin/python", "-m", "hvdkeras", "--fp16-allreduce", "--", "t.py", *script_args]
    # ... and `python -m hvdkeras` (the worker) parses that command back into the script and its options.
    from hvdkeras.cli.parse import build_worker_parser

    worker = build_worker_parser().parse_args(parsed.command[3:])
    assert worker.fp16_allreduce and worker.script == "t.py" and worker.script_args == script_args
