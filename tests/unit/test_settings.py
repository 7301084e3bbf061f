"""hvdkeras.settings: the one table of HVDKERAS_* variables, its parsing, its one error format, and what is
derived from it (the docs' table, the command-line flags, wrap.Options)."""

import pathlib
import re

import pytest

from hvdkeras import settings

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_unset_and_empty_variables_give_the_defaults():
    assert settings.read({}) == settings.Settings()
    assert settings.read({"HVDKERAS_BUCKET_BYTES": "  ", "HVDKERAS_JOB_ID": ""}) == settings.Settings()
    s = settings.Settings()
    assert (s.batch, s.warmup_epochs, s.bucket_bytes, s.stall_timeout, s.check_models, s.horovod_nice) == \
        ("global", 1, 64 << 10, 60.0, True, None)


def test_every_kind_parses():
    s = settings.read({
        "HVDKERAS_BATCH": "per-worker", "HVDKERAS_WARMUP_EPOCHS": "2.5", "HVDKERAS_FP16_ALLREDUCE": "yes",
        "HVDKERAS_BACKWARD_PASSES_PER_STEP": "3", "HVDKERAS_NO_SHARD": "off", "HVDKERAS_REPORT_DIR": " /tmp/r ",
        "HVDKERAS_RENDEZVOUS_PORT": "4000", "HVDKERAS_STALL_TIMEOUT": "0.5", "HVDKERAS_HOROVOD_NICE": "-5",
        "HVDKERAS_CHECK_MODELS": "0"})
    assert (s.batch, s.warmup_epochs, s.fp16_allreduce, s.backward_passes_per_step, s.no_shard, s.report_dir,
            s.rendezvous_port, s.stall_timeout, s.horovod_nice, s.check_models) == \
        ("per-worker", 2.5, True, 3, False, "/tmp/r", 4000, 0.5, -5, False)
    assert settings.read({"HVDKERAS_WARMUP_EPOCHS": "3"}).warmup_epochs == 3
    assert settings.read({"HVDKERAS_HOROVOD_NICE": "None"}).horovod_nice == "none"


@pytest.mark.parametrize("name, raw, what", [
    ("HVDKERAS_BATCH", "local", "one of global, per-worker"),
    ("HVDKERAS_WARMUP_EPOCHS", "-1", "a finite number >= 0"),
    ("HVDKERAS_WARMUP_EPOCHS", "nan", "a finite number >= 0"),
    ("HVDKERAS_FP16_ALLREDUCE", "maybe", "one of 1/0/true/false/yes/no/on/off"),
    ("HVDKERAS_BACKWARD_PASSES_PER_STEP", "1.5", "an integer >= 1"),
    ("HVDKERAS_BUCKET_BYTES", "-1", "an integer >= 0"),
    ("HVDKERAS_RENDEZVOUS_PORT", "70000", "a TCP port in [1, 65535]"),
    ("HVDKERAS_RENDEZVOUS_TIMEOUT", "0", "a number of seconds > 0"),
    ("HVDKERAS_STALL_TIMEOUT", "soon", "a number of seconds > 0"),
    ("HVDKERAS_HOROVOD_NICE", "20", "a nice value, an integer from -20 to 19"),
])
def test_one_error_format_names_the_variable_what_it_must_be_and_what_was_received(name, raw, what):
    with pytest.raises(ValueError) as err:
        settings.read({name: raw})
    assert str(err.value).startswith(f"{name} must be {what}")
    assert str(err.value).endswith(f"Received: {name}={raw!r}")


@pytest.mark.parametrize("name, raw, what", [
    # oversized: a number no integer of Horovod's holds, and a value too long to repeat in full
    ("HVDKERAS_BUCKET_BYTES", "9" * 400, "an integer >= 0 and at most 2**63 - 1"),
    ("HVDKERAS_STALL_TIMEOUT", "1" * 400, "a number of seconds > 0 and at most 2**63 - 1"),
    ("HVDKERAS_STALL_TIMEOUT", "1e400", "a number of seconds > 0"),
    ("HVDKERAS_BATCH", "g" * 5000, "one of global, per-worker"),
    # truncated or wrongly typed
    ("HVDKERAS_RENDEZVOUS_PORT", "80.", "a TCP port in [1, 65535]"),
    ("HVDKERAS_BUCKET_BYTES", "64k", "an integer >= 0"),
    ("HVDKERAS_STALL_TIMEOUT", "nan", "a number of seconds > 0"),
    ("HVDKERAS_WARMUP_EPOCHS", "1,5", "a finite number >= 0"),
])
def test_oversized_truncated_and_wrongly_typed_values_are_refused_clearly(name, raw, what):
    with pytest.raises(ValueError) as err:
        settings.read({name: raw})
    message = str(err.value)
    assert message.startswith(f"{name} must be {what}. Received: {name}="), message
    assert raw[:40] in message and len(message) < 250, message  # what was received, cut to a readable length


def test_read_raises_the_error_class_asked_for():
    class LaunchError(ValueError):
        pass

    with pytest.raises(LaunchError, match="Received: HVDKERAS_RENDEZVOUS_PORT='0'"):
        settings.read({"HVDKERAS_RENDEZVOUS_PORT": "0"}, LaunchError)


def test_given_lists_only_the_variables_that_are_set():
    assert settings.given({"HVDKERAS_BATCH": "per-worker", "HVDKERAS_JOB_ID": "", "OTHER": "1"}) == \
        {"batch": "per-worker"}


def test_check_value_for_arguments_and_flags():
    assert settings.check_value("warmup_epochs", 0) == 0
    with pytest.raises(ValueError, match=r"`warmup_epochs` must be a finite number >= 0. Received: warmup_epochs=-1"):
        settings.check_value("warmup_epochs", -1)
    with pytest.raises(ValueError, match=r"`backward_passes_per_step` must be an integer >= 1. "
                                         r"Received: backward_passes_per_step=True"):
        settings.check_value("backward_passes_per_step", True)
    with pytest.raises(TypeError, match="--warmup-epochs must be a finite number >= 0. Received: --warmup-epochs -1.5"):
        settings.check_value("warmup_epochs", -1.5, error=TypeError, flag=True)
    assert settings.check_value("lr_scaling", None) is None  # None is the default: follows the batch convention


def test_the_docs_show_the_table():
    assert settings.table_markdown() in (ROOT / "docs" / "settings.md").read_text()


def test_the_table_is_the_one_list_of_variables_the_package_names():
    """Every HVDKERAS_* name spelled in the package is a setting's variable."""
    names = set()
    for path in [*(ROOT / "hvdkeras").rglob("*.py"), *(ROOT / "callbacks").rglob("*.py")]:
        names |= set(re.findall(r"HVDKERAS_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    table = {settings.variable(f.name) for f in settings.fields()}
    assert names - {"HVDKERAS_X"} <= table, names - table  # HVDKERAS_X: the error format in docstrings


def test_the_install_cache_is_a_setting_with_the_scripts_default(tmp_path):
    assert settings.cache_dir({"HVDKERAS_CACHE_DIR": str(tmp_path)}) == str(tmp_path)
    assert settings.cache_dir({"XDG_CACHE_HOME": "/x"}) == "/x/hvdkeras"
    script = (ROOT / "scripts" / "install_horovod.sh").read_text()
    assert "${HVDKERAS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdkeras}" in script  # the same default
    assert "HVDKERAS_CACHE_DIR" not in (ROOT / "scripts" / "cuda_toolkit.py").read_text().split('"""', 2)[2]


def test_flags_and_wrap_options_are_derived_from_the_training_settings():
    from hvdkeras import wrap
    from hvdkeras.cli import parse as cli

    training = [f.name for f in settings.training_settings()]
    assert list(cli.WRAP_FLAGS) == training
    parser = cli.build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]
    flags = {a.dest for a in run._actions if a.option_strings}
    assert set(training) <= flags
    import dataclasses

    assert [f.name for f in dataclasses.fields(wrap.Options)] == training
    assert wrap.Options() == wrap.Options(**{f.name: f.default for f in settings.training_settings()})
    with pytest.raises(ValueError, match="Received: batch='local'"):
        wrap.Options(batch="local")


def test_the_process_reads_its_settings_once(monkeypatch):
    """settings.current(): read at the first use (or given by the edge, `use`), then kept for the process."""
    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", "128")
    first = settings.current()
    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", "256")
    assert settings.current() is first and first.bucket_bytes == 128
    given = settings.read({"HVDKERAS_BUCKET_BYTES": "512"})
    settings.use(given)
    assert settings.current() is given
    settings.use(None)
    assert settings.current().bucket_bytes == 256
    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", "64k")
    settings.use(None)
    with pytest.raises(ValueError, match="Received: HVDKERAS_BUCKET_BYTES='64k'"):
        settings.current()
    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", "8")
    assert settings.current().bucket_bytes == 8  # nothing was kept from the failed read


def test_no_module_below_the_edges_reads_the_environment_itself():
    """The variables are read by the edges (python -m hvdkeras, the hvdkeras command, the engines, forming the job
    from the launcher's environment): everywhere else asks settings.current()."""
    import re

    edges = {"__main__.py", "settings.py"}
    readers = []
    for path in sorted((ROOT / "hvdkeras").rglob("*.py")) + sorted((ROOT / "callbacks").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if path.name in edges or rel.startswith(("hvdkeras/cli/", "hvdkeras/job/", "hvdkeras/engines/")):
            continue
        text = path.read_text()
        if re.search(r"settings\.read\(|os\.environ", text) and "HVDKERAS_" in text:
            readers.append(rel)
    assert readers == [], readers
