"""The one place that checks versions: TensorFlow >= 2.16 with Keras 3.

Everything else in hvdkeras assumes Keras 3 on the TensorFlow backend and never branches on versions.
"""

from __future__ import annotations

MIN_TF = (2, 16)
MIN_KERAS = (3, 0)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def check_versions(tf_version: str, keras_version: str, keras_backend: str) -> None:
    """Raises ImportError unless the installed versions are supported.

    Args:
        tf_version: `tensorflow.__version__`.
        keras_version: `keras.__version__`.
        keras_backend: `keras.backend.backend()`.

    Raises:
        ImportError: TensorFlow < 2.16, Keras < 3, or a Keras backend other than TensorFlow.
    """
    if _version_tuple(tf_version) < MIN_TF:
        raise ImportError(
            "hvdkeras requires TensorFlow >= 2.16 (Keras 3). "
            f"Received: tensorflow=={tf_version}. Upgrade with `pip install 'tensorflow>=2.16'`."
        )
    if _version_tuple(keras_version) < MIN_KERAS:
        raise ImportError(
            "hvdkeras requires Keras 3; for Keras 2 use horovod.tensorflow.keras. "
            f"Received: keras=={keras_version}. Unset TF_USE_LEGACY_KERAS and `pip install 'keras>=3'`."
        )
    if keras_backend != "tensorflow":
        raise ImportError(
            "hvdkeras runs on the TensorFlow backend of Keras 3. "
            f"Received: KERAS_BACKEND={keras_backend!r}. Set KERAS_BACKEND=tensorflow."
        )


def check_installed() -> None:
    """Checks the versions of the TensorFlow and Keras that are installed."""
    import keras
    import tensorflow as tf

    check_versions(tf.__version__, keras.__version__, keras.backend.backend())


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """Horovod's helper: whether version `ver` >= `target` ("major.minor.patch").

    Raises:
        ValueError: a non-string argument, or a target not of the form major.minor.patch.
    """
    from packaging import version

    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError(f"Both versions must be strings. Received: ver={ver!r}, target={target!r}")
    if len(target.split(".")) != 3:
        raise ValueError(f"The target must be major.minor.patch. Received: target={target!r}")
    return version.parse(ver) >= version.parse(target)
