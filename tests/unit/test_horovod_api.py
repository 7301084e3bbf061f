"""`import hvdkeras as hvd` in place of `import horovod.tensorflow.keras as hvd`: every public name of
Horovod's Keras modules exists, with Horovod's parameters in Horovod's order and with Horovod's defaults
(hvdkeras's own extra parameters come after them). Read from the installed Horovod, which imports fine on
Keras 3 (it only fails when used)."""

import inspect

import pytest

import hvdkeras

horovod_keras = pytest.importorskip("horovod.tensorflow.keras")
import horovod.tensorflow.keras.callbacks as horovod_callbacks  # noqa: E402
import horovod.tensorflow.keras.elastic as horovod_elastic  # noqa: E402

MODULES = [(horovod_keras, hvdkeras), (horovod_callbacks, hvdkeras.callbacks), (horovod_elastic, hvdkeras.elastic)]
# Horovod's Keras `init(*args, **kwargs)` forwards to horovod.tensorflow.init(comm=None, process_sets=None).
FORWARDED = {"init": ["comm", "process_sets"]}


def public(module):
    """The module's `__all__`, plus what it defines or imports from Horovod under a public name outside
    `__all__` (horovod.tensorflow.keras.elastic exports TensorFlowKerasState so)."""
    names = set(getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")])
    names |= {n for n in dir(module) if not n.startswith("_")
              and (getattr(getattr(module, n), "__module__", "") or "").startswith("horovod")}
    return sorted(n for n in names if not inspect.ismodule(getattr(module, n)))


def parameters(obj):
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = list(inspect.signature(target).parameters.values())
    return [p for p in params if p.name != "self"]


def same_default(theirs, ours) -> bool:
    if theirs is inspect.Parameter.empty:
        return True  # ours may add a default where Horovod has none
    if inspect.isclass(theirs) or inspect.isclass(ours):
        return getattr(theirs, "__name__", theirs) == getattr(ours, "__name__", ours)  # Compression.none
    if type(theirs).__name__ == "ProcessSet":
        return ours is hvdkeras.global_process_set and theirs.process_set_id == ours.process_set_id
    return theirs == ours


CASES = [(their_mod, our_mod, name) for their_mod, our_mod in MODULES for name in public(their_mod)]


@pytest.mark.parametrize("their_mod, our_mod, name", CASES,
                         ids=[f"{m.__name__.split('.')[-1]}.{n}" for m, _, n in CASES])
def test_horovod_name_exists_with_horovods_parameters(their_mod, our_mod, name):
    assert hasattr(our_mod, name), f"hvdkeras lacks {their_mod.__name__}.{name}"
    theirs, ours = getattr(their_mod, name), getattr(our_mod, name)
    if not callable(theirs) or name == "Compression":
        return
    their_params = parameters(theirs)
    if [p.kind for p in their_params] == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]:
        expected = FORWARDED.get(name, [])
        assert [p.name for p in parameters(ours)][:len(expected)] == expected
        return
    our_params = parameters(ours)
    named = [p for p in their_params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    assert [p.name for p in our_params[:len(named)]] == [p.name for p in named], \
        f"{name}: Horovod's parameters {[p.name for p in named]}, ours {[p.name for p in our_params]}"
    for t, o in zip(named, our_params):
        assert o.kind in (o.POSITIONAL_OR_KEYWORD, o.POSITIONAL_ONLY) or t.kind == t.KEYWORD_ONLY, \
            f"{name}: {o.name} is keyword-only here, positional in Horovod"
        assert same_default(t.default, o.default), f"{name}: {t.name} defaults to {t.default!r}, ours {o.default!r}"
    extra = our_params[len(named):]
    assert all(p.default is not inspect.Parameter.empty or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
               for p in extra), f"{name}: our extra parameters must be optional: {[p.name for p in extra]}"


def test_partial_distributed_optimizer_matches_horovod_keras():
    import horovod.keras  # the standalone-Keras module defines it

    names = [p.name for p in parameters(horovod.keras.PartialDistributedOptimizer)]
    ours = parameters(hvdkeras.PartialDistributedOptimizer)
    assert [p.name for p in ours[:len(names)]] == names
    assert [(p.name, p.default) for p in ours[len(names):]] == [("bucket_bytes", None),
                                                                ("shard_optimizer_state", False), ("reducer", None)]


def test_is_version_greater_equal_than():
    assert hvdkeras.is_version_greater_equal_than("2.21.0", "2.16.0")
    assert not hvdkeras.is_version_greater_equal_than("2.15.1", "2.16.0")
    with pytest.raises(ValueError, match="major.minor.patch. Received: target='2.16'"):
        hvdkeras.is_version_greater_equal_than("2.21.0", "2.16")


def test_sync_batch_normalization_matches_horovod_tensorflow(hvd):
    import horovod.tensorflow
    import keras
    import numpy as np

    assert [p.name for p in parameters(horovod.tensorflow.SyncBatchNormalization)] == \
        [p.name for p in parameters(hvdkeras.SyncBatchNormalization)] == ["fused", "kwargs"]
    with pytest.raises(ValueError, match="does not support fused=True. Received: fused=True"):
        hvdkeras.SyncBatchNormalization(fused=True)
    x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")  # one worker: plain batch norm
    np.testing.assert_allclose(hvdkeras.SyncBatchNormalization()(x, training=True),
                               keras.layers.BatchNormalization()(x, training=True), atol=1e-5)


def test_spark_run_has_horovod_spark_runs_parameters():
    import horovod.spark

    import hvdkeras.spark

    theirs = inspect.signature(horovod.spark.run).parameters
    ours = inspect.signature(hvdkeras.spark.run).parameters
    assert list(ours)[:len(theirs)] == list(theirs)
    for name, param in theirs.items():
        if name == "kwargs":  # Horovod's mutable default {}; None means the same: no keyword arguments
            assert param.default == {} and ours[name].default is None
        else:
            assert ours[name].default == param.default, name
