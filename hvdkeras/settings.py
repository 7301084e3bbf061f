"""Every HVDKERAS_* environment variable, read into one typed, frozen object: `read(environ) -> Settings`.

The fields of `Settings` are the one list of variables (docs/settings.md shows it): each field's metadata
says how its variable is parsed and what it does. A variable that is unset or empty gives the default; one
that does not parse fails with one message format: "HVDKERAS_X must be WHAT. Received: HVDKERAS_X='raw'".
The training options (`flag=True`) are also the flags of `python -m hvdkeras` and `hvdkeras run`, and the
fields of `hvdkeras.wrap.Options`: `training_settings()` lists them for the three.

Plain Python, so `hvdkeras run` reads it without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping

PREFIX = "HVDKERAS_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
# Seconds a worker may stop answering before the job fails (Horovod's and Gloo's timeouts): the workers'
# background threads exchange messages every few milliseconds whatever training does, so it measures whether
# a process is alive, not how long a step takes.
DEFAULT_STALL_TIMEOUT = 60.0
# Gradients are reduced in buckets of about this many bytes, in the order the backward pass produces them, so
# the first buckets travel while the rest of the backward pass still runs. Chosen by measurement on two hosts
# over a shaped link (benchmarks/network_benchmark.py; docs/network.md).
DEFAULT_BUCKET_BYTES = 64 << 10
DEFAULT_RENDEZVOUS_TIMEOUT = 60.0
# Under `python -m hvdkeras`, how long a worker other than rank 0 waits for a folder or checkpoint of the
# script's that rank 0 writes (hvdkeras.training.script_writes) before it goes on without it.
DEFAULT_WRITE_WAIT = 60.0
# How a learning rate scales with the number of workers (hvdkeras.training.learning_rate.scale_factor).
LR_SCALING_RULES = ("linear", "sqrt", "none")
# The reducers `--reducer` names (hvdkeras.reduce), each with the options it takes there and their kinds: the
# reducer's constructor arguments (a unit test keeps the two alike), given as NAME:KEY=VALUE,...
REDUCER_OPTIONS: dict[str, dict[str, str]] = {
    "allreduce": {},
    "reduce_scatter": {},
    "powersgd": {"rank": "int", "start_step": "int", "min_compression_rate": "number", "error_feedback": "bool",
                 "warm_start": "bool", "seed": "int"},
    "local_sgd": {"period": "int", "warmup_steps": "int"},
    "diloco": {"period": "int", "outer_learning_rate": "number", "outer_momentum": "number", "nesterov": "bool"},
}
REDUCER_REQUIRED = {"local_sgd": ("period",), "diloco": ("period",)}


def reducer_spec(text: str) -> tuple[str, dict[str, Any]]:
    """`--reducer`'s value, NAME or NAME:KEY=VALUE,..., as (name, options); the values parsed by their kind.

    Raises:
        ValueError: an unknown name or option, a value of the wrong kind, or a required option missing, saying
            what is expected (the caller adds what was received).
    """
    name, _, rest = text.strip().partition(":")
    name = name.strip()
    if name not in REDUCER_OPTIONS:
        raise ValueError(f"names a reducer: one of {', '.join(REDUCER_OPTIONS)}")
    kinds, options = REDUCER_OPTIONS[name], {}
    for item in (i.strip() for i in rest.split(",") if i.strip()):
        key, eq, raw = (part.strip() for part in item.partition("="))
        if key not in kinds:
            takes = ", ".join(kinds) if kinds else "no options"
            raise ValueError(f"gives {name} an option it does not take ({key!r}); {name} takes {takes}")
        if not eq or key in options:
            raise ValueError(f"gives each option once, as KEY=VALUE (such as {name}:{next(iter(kinds))}=...)")
        kind = kinds[key]
        if kind == "bool":
            value: Any = _bool(raw)
        else:
            value = _number(raw, integer=kind == "int")
            value = None if value is None or isinstance(value, float) and not math.isfinite(value) else value
        if value is None:
            noun = {"int": "an integer", "number": "a finite number", "bool": "true or false"}[kind]
            raise ValueError(f"gives {name}'s {key} {noun}")
        options[key] = value
    missing = [k for k in REDUCER_REQUIRED.get(name, ()) if k not in options]
    if missing:
        raise ValueError(f"gives {name} its {', '.join(missing)} (such as {name}:{missing[0]}=8)")
    return name, options


def _setting(default: Any, kind: str, doc: str, *, flag: bool = False, choices: tuple = (),
             minimum: float | None = None, maximum: float | None = None) -> Any:
    return dataclasses.field(default=default, metadata={
        "kind": kind, "doc": doc, "flag": flag, "choices": choices, "minimum": minimum, "maximum": maximum})


@dataclasses.dataclass(frozen=True)
class Settings:
    """The HVDKERAS_* variables of this process, parsed. Field `x` is variable HVDKERAS_X."""

    # ---- training options: also flags of `python -m hvdkeras` / `hvdkeras run`, and wrap.Options's fields
    batch: str = _setting(
        "global", "choice", "global (Keras's convention): each of the script's batches is split over the workers and "
        "the learning rate is left as it is; per-worker: each worker trains on whole batches (N times the global "
        "batch) and the rate is scaled", flag=True, choices=("global", "per-worker"))
    lr_scaling: str | None = _setting(
        None, "choice", "scale the script's learning rate with the number of workers (default: linear with "
        "--batch per-worker, none with --batch global)", flag=True, choices=LR_SCALING_RULES)
    warmup_epochs: float = _setting(
        1, "number", "warm the scaled learning rate up over this many epochs (default: 1; 0 turns it off)",
        flag=True, minimum=0)
    fp16_allreduce: bool = _setting(False, "bool", "send gradients as float16", flag=True)
    backward_passes_per_step: int = _setting(
        1, "int", "accumulate gradients locally over K batches per allreduce (default: 1)", flag=True, minimum=1)
    shard_optimizer_state: bool = _setting(
        False, "bool", "shard the optimizer's state across the workers (ZeRO: each worker keeps the optimizer's "
        "slots for its own share of the variables; docs/sharding.md)", flag=True)
    reducer: str = _setting(
        "allreduce", "reducer", "how the gradients are reduced: allreduce, reduce_scatter (as "
        "--shard-optimizer-state), powersgd, local_sgd or diloco, with options as NAME:KEY=VALUE,..., such as "
        "powersgd:rank=4,start_step=100 or local_sgd:period=8 (docs/slow_links.md)", flag=True)
    xla: str = _setting(
        "keep", "choice", "keep: a model compiled with XLA (jit_compile) keeps it for its forward and backward "
        "pass, and its gradients are reduced outside (docs/gpu.md); off: XLA is turned off for the train step",
        flag=True, choices=("keep", "off"))
    no_shard: bool = _setting(
        False, "bool", "do not shard fit/evaluate data (for scripts that shard themselves)", flag=True)
    report_dir: str | None = _setting(
        None, "str", "each worker writes a JSON summary (steps per fit, weights digest) here", flag=True)
    # ---- the optimizer
    bucket_bytes: int = _setting(
        DEFAULT_BUCKET_BYTES, "int", "bytes per gradient bucket when DistributedOptimizer gets no bucket_bytes "
        "(0: one allreduce after the whole backward pass)", minimum=0)
    # ---- forming the job
    launcher: str | None = _setting(
        None, "str", "`none` (or off, 0): read no launcher's variables, so every process trains alone")
    rendezvous_addr: str | None = _setting(
        None, "str", "rank 0's host name or address for the rendezvous (else MASTER_ADDR, else the launcher's)")
    rendezvous_port: int | None = _setting(
        None, "port", "the rendezvous port on rank 0's host (else MASTER_PORT, else derived from the job id)",
        minimum=1, maximum=65535)
    job_id: str | None = _setting(
        None, "str", "the job's id, the same in every process: a worker of another job is never admitted")
    iface: str | None = _setting(None, "str", "the network interface Gloo uses (default: the one routing to rank 0)")
    secret_file: str | None = _setting(
        None, "str", "a file (mode 600) holding the job's shared secret, at least 32 bytes, the same for every "
        "process: every request to hvdkeras's rendezvous is then signed with HMAC-SHA256, and unsigned, wrong or "
        "replayed ones are refused (docs/security.md); `hvdkeras run --nnodes` makes one when unset")
    rendezvous_timeout: float = _setting(
        DEFAULT_RENDEZVOUS_TIMEOUT, "seconds", "the bound on forming the job, and on Horovod connecting it")
    stall_timeout: float = _setting(
        DEFAULT_STALL_TIMEOUT, "seconds", "seconds a worker may stop answering before the job fails "
        "(`hvdkeras run --stall-timeout`)")
    horovod_nice: int | str | None = _setting(
        None, "nice", "the nice value of Horovod's threads, an integer from -20 to 19, or `none` to leave them; "
        "unset: -15 when the job spans hosts over Gloo", minimum=-20, maximum=19)
    write_wait: float = _setting(
        DEFAULT_WRITE_WAIT, "seconds", "under `python -m hvdkeras`, how long a worker other than rank 0 waits for a "
        "folder or checkpoint the script writes on rank 0 before it goes on (a folder only that worker's script "
        "names, such as one per rank, waits this long)")
    error_dir: str | None = _setting(
        None, "str", "where each worker writes its error record when the script fails (`hvdkeras run` makes one "
        "per job; the launcher reports the root cause from them)")
    # ---- checks
    check_models: bool = _setting(
        True, "bool", "compare the workers' models (names, shapes, dtypes, then values) before broadcasts")
    # ---- installing
    cache_dir: str | None = _setting(
        None, "str", "where `make install` and `make gpu-build` cache Horovod's wheels and the CUDA tools "
        "(default: $XDG_CACHE_HOME/hvdkeras, else ~/.cache/hvdkeras; scripts/install_horovod.sh, "
        "scripts/cuda_toolkit.py)")
    # ---- output
    tf_startup_log: bool = _setting(
        False, "bool", "show TensorFlow's C++ start-up lines (absl's notice before InitializeLog, the oneDNN and "
        "CPU-feature lines), which `hvdkeras run` and `make demo` leave out of the job's output")


def cache_dir(environ: Mapping[str, str] | None = None) -> str:
    """The install scripts' cache: HVDKERAS_CACHE_DIR, else $XDG_CACHE_HOME/hvdkeras, else ~/.cache/hvdkeras."""
    environ = os.environ if environ is None else environ
    given = read(environ).cache_dir
    if given:
        return given
    return os.path.join(environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hvdkeras")


def horovod_stall_environ(stall: float, end_hangs: bool = False) -> dict[str, str]:
    """Horovod's variables for the stall bound `stall` (seconds): Gloo's timeout on an operation in flight, and,
    with `end_hangs`, Horovod's stall inspector, which names the ranks missing from a collective and the tensors
    they miss, then shuts the job down. The inspector counts whole seconds and looks every CHECK seconds; a
    collective that was cached is found stalled one look later, so the shutdown waits STALL - 2 * CHECK."""
    out = {"HOROVOD_GLOO_TIMEOUT_SECONDS": f"{stall:g}"}
    if end_hangs:
        whole = max(1, math.ceil(stall))
        check = max(1, whole // 6)
        out.update({"HOROVOD_STALL_CHECK_TIME_SECONDS": str(check),
                    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(max(check, whole - 2 * check))})
    return out


def variable(name: str) -> str:
    """The environment variable of setting `name`: HVDKERAS_<NAME>."""
    return PREFIX + name.upper()


def fields() -> tuple[dataclasses.Field, ...]:
    """The table: one field per variable, in the documented order."""
    return dataclasses.fields(Settings)


def training_settings() -> tuple[dataclasses.Field, ...]:
    """The training options: the flags of `python -m hvdkeras` and `hvdkeras run`, and wrap.Options's fields."""
    return tuple(f for f in fields() if f.metadata["flag"])


def what(field: dataclasses.Field) -> str:
    """What a setting's value must be, in words, for the error messages."""
    meta = field.metadata
    kind, low, high = meta["kind"], meta["minimum"], meta["maximum"]
    if kind == "str":
        return "text"
    if kind == "reducer":
        return "a reducer, NAME or NAME:KEY=VALUE,... (docs/slow_links.md)"
    if kind == "choice":
        return f"one of {', '.join(meta['choices'])}"
    if kind == "bool":
        return "one of 1/0/true/false/yes/no/on/off"
    if kind == "seconds":
        return "a number of seconds > 0"
    if kind == "port":
        return f"a TCP port in [{low}, {high}]"
    if kind == "nice":
        return f"a nice value, an integer from {low} to {high}, or `none` to leave Horovod's threads as they start"
    noun = "an integer" if kind == "int" else "a finite number"
    if high is not None:
        return f"{noun} in [{low:g}, {high:g}]"
    return f"{noun} >= {low:g}" if low is not None else noun


_INTEGER_KINDS = ("int", "port", "nice")
_LARGEST = 2 ** 63 - 1  # what Horovod and TensorFlow hold in an integer; a number beyond it is refused
_SHOWN = 80  # characters of a received value an error message repeats


def received(value: Any, limit: int = _SHOWN) -> str:
    """`value` as an error message repeats it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _detail(field: dataclasses.Field, value: Any) -> str:
    """What an error adds to what the value must be: what a `--reducer` value lacks, or that a number is too
    large to hold."""
    if field.metadata["kind"] == "reducer" and isinstance(value, str):
        return f" that {_reducer_problem(value)}"
    return _beyond(value)


def _beyond(value: Any) -> str:
    """The words an error adds for a number too large to hold."""
    big = isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > _LARGEST
    return " and at most 2**63 - 1" if big and (not isinstance(value, float) or math.isfinite(value)) else ""


def _acceptable(field: dataclasses.Field, value: Any) -> bool:
    """Whether a value (already a Python bool, str or number) is one the setting takes."""
    meta = field.metadata
    kind, low, high = meta["kind"], meta["minimum"], meta["maximum"]
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "choice":
        return value in meta["choices"]
    if kind == "str":
        return isinstance(value, str)
    if kind == "reducer":
        return isinstance(value, str) and _reducer_problem(value) is None
    if kind == "nice" and value == "none":
        return True
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    if abs(value) > _LARGEST or not math.isfinite(value):
        return False
    return ((kind not in _INTEGER_KINDS or isinstance(value, int)) and (low is None or value >= low)
            and (high is None or value <= high) and (kind != "seconds" or value > 0))


def parse(field: dataclasses.Field, raw: str, error: type[Exception] = ValueError) -> Any:
    """A variable's text as the setting's value.

    Raises:
        `error`: it does not parse, in the format "HVDKERAS_X must be WHAT. Received: HVDKERAS_X='raw'".
    """
    kind, text = field.metadata["kind"], raw.strip()
    if kind in ("str", "choice", "reducer"):
        value: Any = text
    elif kind == "bool":
        value = _bool(text)
    elif kind == "nice" and text.lower() == "none":
        value = "none"
    else:
        value = _number(text, integer=kind in _INTEGER_KINDS)
    if value is None or not _acceptable(field, value):
        name = variable(field.name)
        raise error(f"{name} must be {what(field)}{_detail(field, text if kind == 'reducer' else value)}. "
                    f"Received: {name}={received(raw)}")
    return value


def check_reducer_with_sharding(reducer: str, shard_optimizer_state: bool, error: type[Exception] = ValueError) -> None:
    """`--reducer` other than allreduce or reduce_scatter with `--shard-optimizer-state`: the reduce-scatter is
    a reducer of its own, and the others update whole variables on every worker.

    Raises:
        `error`: naming both flags and what was received.
    """
    name = reducer_spec(reducer)[0]
    if shard_optimizer_state and name not in ("allreduce", "reduce_scatter"):
        raise error(f"--reducer {name} cannot be combined with --shard-optimizer-state (the reduce-scatter reducer, "
                    f"ZeRO): {name} keeps the whole optimizer state on every worker. Pass one of them. Received: "
                    f"--reducer {received(reducer)} --shard-optimizer-state")


def _reducer_problem(text: str) -> str | None:
    """What a `--reducer` value lacks, or None when it is one."""
    try:
        reducer_spec(text)
    except ValueError as e:
        return str(e)
    return None


def check_value(name: str, value: Any, error: type[Exception] = ValueError, flag: bool = False) -> Any:
    """A setting's value given in Python (an argument) or as a parsed flag, checked against its field.

    Raises:
        `error`: naming the setting ("`name`", or "--name" with `flag`), what it must be, and what was received.
    """
    field = {f.name: f for f in fields()}[name]
    if value is None and field.default is None:
        return None
    if not _acceptable(field, value):
        if flag:
            shown = f"{value:g}" if isinstance(value, float) else value
            label = "--" + name.replace("_", "-")
            raise error(f"{label} must be {what(field)}{_detail(field, value)}. Received: {label} {shown}")
        raise error(f"`{name}` must be {what(field)}{_detail(field, value)}. Received: {name}={received(value)}")
    return value


def _bool(text: str) -> bool | None:
    """1/true/yes/on as True, 0/false/no/off as False (any case), anything else None."""
    return True if text.lower() in _TRUE else False if text.lower() in _FALSE else None


def _number(text: str, integer: bool) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        pass
    if integer:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def given(environ: Mapping[str, str], error: type[Exception] = ValueError) -> dict[str, Any]:
    """The settings whose variables are set (and not empty) in `environ`, parsed, by field name.

    Raises:
        `error` (ValueError by default): a variable does not parse (see `parse`).
    """
    out = {}
    for field in fields():
        raw = environ.get(variable(field.name))
        if raw is not None and raw.strip():
            out[field.name] = parse(field, raw, error)
    return out


def read(environ: Mapping[str, str] | None = None, error: type[Exception] = ValueError) -> Settings:
    """Every HVDKERAS_* variable of `environ` (default: os.environ) as a Settings; unset ones are defaults.

    Raises:
        `error` (ValueError by default): a variable does not parse, naming it and its value.
    """
    return Settings(**given(os.environ if environ is None else environ, error))


_current: Settings | None = None


def current() -> Settings:
    """The settings this process runs with, read once: those the edge that started the process gave `use`
    (python -m hvdkeras), else os.environ as read at the first call. The modules below the edge ask here, so
    a variable is read once per process, and one bad value fails where the process starts using it.

    Raises:
        ValueError: a variable does not parse, naming it and its value (and nothing is kept).
    """
    global _current
    if _current is None:
        _current = read()
    return _current


def use(given: Settings | None) -> None:
    """Makes `given` the settings of this process (`current()`); None forgets them, so the next `current()`
    reads os.environ again (a test that changes a variable, as a new process would see it)."""
    global _current
    _current = given


def table_markdown() -> str:
    """The table of variables as Markdown (docs/settings.md holds it; a test keeps the two equal)."""
    rows = ["| Variable | Default | Value | What it does |", "|---|---|---|---|"]
    for field in fields():
        default = field.default
        default = "unset" if default is None else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        rows.append(f"| `{variable(field.name)}` | {default} | {what(field)} | {field.metadata['doc']} |")
    return "\n".join(rows) + "\n"
