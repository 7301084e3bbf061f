"""Package layout, public names and version checks."""

import subprocess
import sys

import pytest

import hvdkeras
from hvdkeras import _compat

NEUTRAL_CHECK = """
import importlib.util, hvdkeras
assert importlib.util.find_spec("callbacks") is None, importlib.util.find_spec("callbacks")
assert hvdkeras.callbacks.__name__ == "hvdkeras.callbacks", hvdkeras.callbacks.__name__
print("ok")
"""


def test_callbacks_is_only_a_subpackage(tmp_path):
    out = subprocess.run([sys.executable, "-c", NEUTRAL_CHECK], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_public_api():
    expected = {"init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
                "cross_size", "allreduce", "broadcast", "broadcast_variables", "Average", "Sum", "Compression",
                "DistributedOptimizer", "callbacks", "data", "scale_learning_rate", "load_model"}
    assert expected <= set(hvdkeras.__all__)
    for name in hvdkeras.__all__:
        assert hasattr(hvdkeras, name), name
    assert set(hvdkeras.callbacks.__all__) >= {
        "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
        "LearningRateScheduleCallback", "rank_zero_only", "ModelCheckpoint", "TensorBoard", "CSVLogger",
        "BackupAndRestore"}


def test_calling_before_init_says_to_call_init(tmp_path):
    code = ("import hvdkeras\n"
            "try:\n    hvdkeras.rank()\nexcept RuntimeError as e:\n    print('RT', e)\n"
            "try:\n    hvdkeras.allreduce([1.0])\nexcept RuntimeError as e:\n    print('RT', e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RT")]
    assert len(lines) == 2, out.stdout + out.stderr
    assert all("hvdkeras.init()" in line for line in lines)


@pytest.mark.parametrize(
    "tf_version, keras_version, backend, match",
    [
        ("2.15.1", "3.0.0", "tensorflow", "TensorFlow >= 2.16"),
        ("2.21.0", "2.15.0", "tensorflow", "Keras 3"),
        ("2.21.0", "3.15.1", "jax", "TensorFlow backend"),
    ],
)
def test_unsupported_versions_raise_import_error(tf_version, keras_version, backend, match):
    with pytest.raises(ImportError, match=match):
        _compat.check_versions(tf_version, keras_version, backend)


def test_supported_versions_pass():
    _compat.check_versions("2.16.1", "3.0.0", "tensorflow")
    _compat.check_versions("2.21.0", "3.15.1", "tensorflow")


def test_every_third_party_import_is_a_declared_dependency():
    """Every third-party import is in install_requires, except that the module of an optional engine
    (hvdkeras/<extra>.py, e.g. spark.py) may import what its extra declares."""
    import ast
    import configparser
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    cfg = configparser.ConfigParser()
    cfg.read(repo / "setup.cfg")

    def names(requirements: str) -> set:
        return {re.split(r"[<>=\[ ]", line.strip())[0].lower() for line in requirements.splitlines() if line.strip()}

    declared = names(cfg["options"]["install_requires"])
    # TensorFlow comes from the cpu / gpu extras (two distributions of the one module).
    declared |= {"tensorflow"}
    extras = {name: names(value) for name, value in cfg["options.extras_require"].items()}
    undeclared = {}
    for path in list((repo / "hvdkeras").rglob("*.py")) + list((repo / "callbacks").rglob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
        third_party = {m for m in imported if m not in sys.stdlib_module_names and m not in ("hvdkeras", "callbacks")}
        allowed = declared | extras.get(path.stem, set())
        if third_party - allowed:
            undeclared[str(path.relative_to(repo))] = third_party - allowed
    assert undeclared == {}, f"imported but not declared: {undeclared}"
    assert extras["spark"] >= {"pyspark", "cloudpickle"}
    assert extras["ray"] >= {"ray"}
    assert {"psutil", "packaging"} <= declared


def test_every_subpackage_is_listed_for_the_wheel():
    """setup.cfg lists the packages a wheel holds: every folder of the package with an __init__.py."""
    import configparser
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    cfg = configparser.ConfigParser()
    cfg.read(repo / "setup.cfg")
    listed = {line.strip() for line in cfg["options"]["packages"].splitlines() if line.strip()}
    found = {".".join(path.parent.relative_to(repo).parts) for path in (repo / "hvdkeras").rglob("__init__.py")}
    found.add("hvdkeras.callbacks")  # callbacks/, installed as hvdkeras.callbacks (package_dir)
    assert listed == found, f"missing: {sorted(found - listed)}; listed but absent: {sorted(listed - found)}"


def test_no_module_uses_another_modules_private_names():
    """Inside hvdkeras, a name with a leading underscore is its module's own: no other module imports it or
    reaches it through the module (a private module, such as _collectives, is the package's own and may be
    imported)."""
    import ast
    from pathlib import Path

    root = Path(hvdkeras.__file__).parent
    modules = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
               for p in root.rglob("*.py")}
    breaches = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        aliases = {}  # local name -> hvdkeras module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hvdkeras"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in modules:
                        aliases[alias.asname or alias.name] = full
                    elif alias.name.startswith("_"):
                        breaches.append(f"{path.relative_to(root.parent)}:{node.lineno} imports {full}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("hvdkeras") and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and f"{aliases[node.value.id]}.{node.attr}" not in modules):
                where = f"{path.relative_to(root.parent)}:{node.lineno}"
                breaches.append(f"{where} uses {aliases[node.value.id]}.{node.attr}")
    assert not breaches, "\n".join(breaches)


def test_data_and_elastic_keep_their_public_names():
    """The training modules live in hvdkeras.training; hvdkeras.data and hvdkeras.elastic, Horovod's `hvd.data` and
    `hvd.elastic`, are the same modules under their public names."""
    import importlib

    import hvdkeras
    import hvdkeras.data
    import hvdkeras.elastic
    from hvdkeras.data import shard

    for name in ("data", "elastic"):
        module = importlib.import_module(f"hvdkeras.training.{name}")
        assert importlib.import_module(f"hvdkeras.{name}") is module
        assert getattr(hvdkeras, name) is module
    assert shard is importlib.import_module("hvdkeras.training.data").shard
