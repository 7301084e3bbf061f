"""Importing hvdkeras changes nothing in Keras; every patch is installed explicitly and undone exactly."""

import subprocess
import sys
import textwrap

import keras
import pytest

from hvdkeras import patches

# Records every public attribute of Keras's public modules, and the own attributes of every class they
# export and of the classes in those classes' MROs, by identity; imports all of hvdkeras; compares.
IMPORT_CHECK = textwrap.dedent(
    """
    import importlib, sys
    import tensorflow, keras

    MODULES = ["keras", "keras.layers", "keras.models", "keras.optimizers", "keras.optimizers.schedules",
               "keras.callbacks", "keras.saving", "keras.mixed_precision", "keras.losses", "keras.metrics",
               "keras.utils", "keras.ops", "keras.backend", "keras.random", "keras.tree", "keras.initializers"]

    def snapshot():
        seen, state = set(), {}
        for name in MODULES:
            module = importlib.import_module(name)
            for attr in dir(module):
                obj = getattr(module, attr)
                state[(name, attr)] = id(obj)
                if isinstance(obj, type):
                    for cls in obj.__mro__:
                        if cls in seen or cls is object:
                            continue
                        seen.add(cls)
                        for key, value in list(vars(cls).items()):
                            state[(cls.__module__, cls.__qualname__, key)] = id(value)
        state[("sys", "excepthook")] = id(sys.excepthook)
        return state

    before = snapshot()
    import hvdkeras
    for sub in ("callbacks", "cli", "cli.parse", "cli.command", "cli.check", "cli.supervise", "collectives", "data",
                "elastic", "job.launchers", "job.lifecycle", "job.rendezvous", "job.threads", "training.models",
                "training.optimizer", "patches", "training.rank_zero", "reduce", "reduce.reduce_scatter",
                "training.saving", "settings", "training.sync_batch_norm", "wrap", "__main__"):
        importlib.import_module("hvdkeras." + sub)
    after = snapshot()
    changed = sorted(str(k) for k in set(before) | set(after) if before.get(k) != after.get(k))
    print("checked", len(before), "attributes")
    print("changed", changed)

    # init() installs the sync batch norm patch, shutdown() takes it out again.
    from hvdkeras import patches
    keras_moments = keras.layers.BatchNormalization._moments
    hvdkeras.init()
    installed = patches.installed("sync_batch_norm") and keras.layers.BatchNormalization._moments is not keras_moments
    hvdkeras.shutdown()
    restored = not patches.installed("sync_batch_norm") and keras.layers.BatchNormalization._moments is keras_moments
    print("init installs", installed, "shutdown restores", restored)
    """
)


@pytest.fixture(scope="module")
def import_check() -> dict:
    proc = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("checked", "changed",
                                                                                            "init")))


def test_importing_hvdkeras_leaves_every_keras_attribute_identical(import_check):
    assert int(import_check["checked"].split()[0]) > 3000
    assert import_check["changed"] == "[]"


def test_init_installs_the_sync_batch_norm_patch_and_shutdown_undoes_it(import_check):
    assert import_check["init"] == "installs True shutdown restores True"


def test_install_and_uninstall_restore_the_exact_attributes():
    class Owner:
        def method(self):
            return "original"

    class Child(Owner):
        pass

    original = Owner.__dict__["method"]
    assert patches.install("test-patch", [(Owner, "method", lambda self: "patched"), (Child, "method", lambda s: 1)])
    assert not patches.install("test-patch", [(Owner, "method", lambda self: "again")])  # installed: no change
    assert Owner().method() == "patched" and Child().method() == 1 and patches.installed("test-patch")
    assert patches.uninstall("test-patch")
    assert Owner.__dict__["method"] is original and "method" not in vars(Child)  # Child had none of its own
    assert not patches.uninstall("test-patch") and "test-patch" not in patches.active()


def test_distributed_optimizer_installs_the_compile_config_patch_and_it_undoes(hvd):
    patches.uninstall("compile_config")  # installed by the DistributedOptimizers of earlier tests
    try:
        restored = keras.Model.get_compile_config
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
        assert patches.installed("compile_config") and keras.Model.get_compile_config is not restored
        patches.uninstall("compile_config")
        assert keras.Model.get_compile_config is restored
    finally:
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))  # leave it as the other tests expect


@pytest.mark.parametrize("name", ["compile", "fit", "evaluate", "save", "save_weights", "export"])
def test_wrap_install_and_uninstall_restore_keras_model(name):
    from hvdkeras import wrap

    assert not wrap.installed()
    own = keras.Model.__dict__.get(name)
    inherited = getattr(keras.Model, name)
    wrap.install()
    try:
        assert getattr(keras.Model, name) is not inherited
    finally:
        wrap.uninstall()
    assert keras.Model.__dict__.get(name) is own and getattr(keras.Model, name) is inherited
