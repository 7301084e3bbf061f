"""hvdkeras.training.saving: atomic writes, and models saved from a job that load in plain Keras and in hvdkeras."""

import keras
import numpy as np
import pytest

from hvdkeras.training import saving
from hvdkeras.training.optimizer import DistributedOptimizer

from ..helpers import small_model


def test_atomic_path_never_leaves_a_partial_file(tmp_path):
    target = tmp_path / "m.weights.h5"
    with pytest.raises(RuntimeError):
        with saving.atomic_path(target) as tmp:
            assert tmp.endswith(".weights.h5")
            with open(tmp, "w") as f:
                f.write("half")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / ".m.killed.tmp.weights.h5").write_text("half")  # what a killed earlier save left
    with saving.atomic_path(target) as tmp:
        with open(tmp, "w") as f:
            f.write("whole")
    assert target.read_text() == "whole"
    assert [p.name for p in tmp_path.iterdir()] == ["m.weights.h5"]


@pytest.mark.parametrize("kind", ["adam", "mixed"])
def test_saved_models_are_plain_keras_and_load_model_wraps_them_again(hvd, tmp_path, kind):
    import hvdkeras

    if kind == "mixed":
        keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = small_model()
        opt = hvdkeras.DistributedOptimizer(keras.optimizers.Adam(0.01), backward_passes_per_step=2)
        model.compile(optimizer=opt, loss="mse")
        x, y = np.ones((8, 3), "float32"), np.zeros((8, 2), "float32")
        model.fit(x, y, batch_size=4, epochs=2, verbose=0)
        path = tmp_path / "m.keras"
        model.save(path)
        plain = keras.models.load_model(path)
        expected = keras.optimizers.LossScaleOptimizer if kind == "mixed" else keras.optimizers.Adam
        assert type(plain.optimizer) is expected
        loaded = hvdkeras.load_model(path, compression=hvdkeras.Compression.fp16, backward_passes_per_step=2)
        assert isinstance(loaded.optimizer, DistributedOptimizer)
        assert loaded.optimizer.compression is hvdkeras.Compression.fp16
        assert loaded.optimizer.backward_passes_per_step == 2
        for restored in (plain, loaded):
            assert int(restored.optimizer.iterations) == int(model.optimizer.iterations) == 4  # passes
            for a, b in zip(restored.optimizer.variables, model.optimizer.inner_optimizer.variables):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        loaded.fit(x, y, batch_size=4, epochs=1, verbose=0)
        # Two more passes; under mixed_float16 the loss scaler may skip counting an overflowing update.
        assert int(loaded.optimizer.iterations) in ((5, 6) if kind == "mixed" else (6,))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_checkpoints_load_in_a_process_that_never_imports_hvdkeras(hvd, tmp_path):
    import subprocess
    import sys

    import hvdkeras

    model = small_model()
    model.compile(optimizer=hvdkeras.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse",
                  metrics=["mae"])
    x, y = np.ones((8, 3), "float32"), np.zeros((8, 2), "float32")
    model.fit(x, y, batch_size=4, epochs=2, verbose=0,
              callbacks=[hvdkeras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt-{epoch}.keras"))])
    model.save(tmp_path / "final.keras")
    check = (
        "import sys, keras, numpy as np\n"
        "for name in sys.argv[1:]:\n"
        "    m = keras.models.load_model(name)\n"
        "    assert type(m.optimizer) is keras.optimizers.Adam, type(m.optimizer)\n"
        "    it = int(m.optimizer.iterations)\n"
        "    m.fit(np.ones((8, 3), 'float32'), np.zeros((8, 2), 'float32'), batch_size=4, verbose=0)\n"
        "    assert int(m.optimizer.iterations) == it + 2\n"
        "    print(name.rsplit('/', 1)[-1], it)\n"
        "assert not any(k.startswith('hvdkeras') for k in sys.modules), 'hvdkeras was imported'\n"
    )
    files = [str(tmp_path / n) for n in ("ckpt-1.keras", "ckpt-2.keras", "final.keras")]
    proc = subprocess.run([sys.executable, "-c", check, *files], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ckpt-1.keras", "2", "ckpt-2.keras", "4", "final.keras", "4"]


def test_load_model_wraps_a_plain_optimizer(hvd, tmp_path):
    import hvdkeras

    model = small_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(np.ones((4, 3)), np.zeros((4, 2)), verbose=0)
    model.save(tmp_path / "plain.keras")
    loaded = hvdkeras.load_model(tmp_path / "plain.keras")
    assert isinstance(loaded.optimizer, DistributedOptimizer)
    loaded.fit(np.ones((4, 3)), np.zeros((4, 2)), verbose=0)
    assert int(loaded.optimizer.iterations) == 2


def test_backup_resumes_in_plain_keras_without_hvdkeras(hvd, tmp_path):
    import subprocess
    import sys

    import hvdkeras

    model = small_model()
    model.compile(optimizer=hvdkeras.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    x, y = np.ones((8, 3), "float32"), np.zeros((8, 2), "float32")
    backup = tmp_path / "backup"
    model.fit(x, y, batch_size=4, epochs=2, verbose=0,
              callbacks=[hvdkeras.callbacks.BackupAndRestore(str(backup), delete_checkpoint=False)])
    saved = [np.asarray(v).copy() for v in model.optimizer.variables]
    check = (
        "import sys, json, keras, numpy as np\n"
        "keras.utils.set_random_seed(0)\n"
        "m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])\n"
        "m.compile(optimizer=keras.optimizers.Adam(0.01), loss='mse')\n"
        "seen = []\n"
        "class Probe(keras.callbacks.Callback):\n"
        "    def on_epoch_begin(self, epoch, logs=None):\n"
        "        seen.append((epoch, int(m.optimizer.iterations)))\n"
        "m.fit(np.ones((8, 3), 'float32'), np.zeros((8, 2), 'float32'), batch_size=4, epochs=3, verbose=0,\n"
        "      callbacks=[keras.callbacks.BackupAndRestore(sys.argv[1]), Probe()])\n"
        "assert not any(k.startswith('hvdkeras') for k in sys.modules)\n"
        "print(json.dumps(seen))\n"
    )
    proc = subprocess.run([sys.executable, "-c", check, str(backup)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[[2, 4]]"  # resumed at epoch 3 with the saved iterations
    assert int(saved[0]) == 4


def test_write_atomically_goes_through_a_temporary_name_only_for_local_keras_files(tmp_path):
    seen = []
    saving.write_atomically(lambda path: seen.append(path) or open(path, "w").close(), str(tmp_path / "m.keras"))
    assert seen[0] != str(tmp_path / "m.keras") and seen[0].endswith(".keras")
    assert (tmp_path / "m.keras").exists() and [p.name for p in tmp_path.iterdir()] == ["m.keras"]
    for direct in (str(tmp_path / "export_dir"), "gs://bucket/m.keras", str(tmp_path / "w.weights.json")):
        saving.write_atomically(seen.append, direct)
        assert seen[-1] == direct


def test_write_json_atomically_writes_arrays_as_lists(tmp_path):
    import json

    saving.write_json_atomically(tmp_path / "r.json", {"a": np.arange(3), "b": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": [0, 1, 2], "b": 1}


def test_atomic_model_writes_route_save_and_save_weights_only_inside(hvd, tmp_path):
    model = small_model()
    with saving.atomic_model_writes(model):
        assert "save" in model.__dict__ and "save_weights" in model.__dict__
        model.save_weights(str(tmp_path / "w.weights.h5"))
    assert "save" not in model.__dict__ and "save_weights" not in model.__dict__
    assert [p.name for p in tmp_path.iterdir()] == ["w.weights.h5"]
