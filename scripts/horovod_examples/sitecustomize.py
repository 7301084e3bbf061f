"""Loaded by each worker of scripts/horovod_examples.py (on PYTHONPATH): records what the example trained.

Only where EXAMPLE_DIGESTS_DIR is set and the process is a worker (HOROVOD_RANK is set):
- every Keras model the example makes is kept, and at exit this rank writes rank<R>.json into that folder: each
  model's name, parameter count, and a sha256 of its trainable and of its non-trainable variables (a
  BatchNormalization's moving statistics, which each worker updates from its own batches, as in Horovod);
- `keras.datasets.mnist.load_data` returns the 8x8 digits bundled with hvdkeras's examples
  (examples/digits.csv.gz), scaled up to MNIST's 28x28 uint8 images (1,797 of them), since the worker cannot
  download MNIST.
"""

import os

if os.environ.get("EXAMPLE_DIGESTS_DIR") and "HOROVOD_RANK" in os.environ:
    import atexit
    import hashlib
    import importlib
    import json

    import numpy as np

    _models = []

    def _digits_as_mnist(path="mnist.npz"):
        import importlib.util
        from pathlib import Path

        # examples/_digits.py, loaded by its path: the examples folder is not a package.
        where = Path(__file__).resolve().parents[2] / "examples" / "_digits.py"
        spec = importlib.util.spec_from_file_location("_digits", where)
        digits = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(digits)
        pixels, target = digits.load_digits()
        images = np.kron(pixels.reshape(-1, 8, 8) * (255.0 / 16.0), np.ones((3, 3)))  # 24x24
        images = np.pad(images, ((0, 0), (2, 2), (2, 2))).round().astype("uint8")
        labels = target.astype("uint8")
        return (images, labels), (images, labels)

    def _install():
        import keras
        from keras.src.layers.layer import Layer

        layer_init = Layer.__init__

        def __init__(self, *args, **kwargs):  # noqa: N807 - Layer.__init__, wrapped
            layer_init(self, *args, **kwargs)
            if isinstance(self, keras.Model) and not any(m is self for m in _models):
                _models.append(self)

        Layer.__init__ = __init__
        for name in ("keras.src.datasets.mnist", "keras.datasets.mnist", "keras._tf_keras.keras.datasets.mnist"):
            try:
                importlib.import_module(name).load_data = _digits_as_mnist
            except ImportError:
                pass

    def _digest(arrays):
        return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()

    def _write():
        rank = os.environ["HOROVOD_RANK"]
        models = []
        for model in _models:
            trainable = [np.asarray(v) for v in model.trainable_variables]
            other = [np.asarray(v) for v in model.non_trainable_variables]
            models.append({"name": model.name, "params": int(sum(w.size for w in trainable + other)),
                           "trainable": _digest(trainable), "non_trainable": _digest(other)})
        with open(os.path.join(os.environ["EXAMPLE_DIGESTS_DIR"], f"rank{rank}.json"), "w") as f:
            json.dump({"rank": int(rank), "models": models}, f)

    _install()
    atexit.register(_write)
