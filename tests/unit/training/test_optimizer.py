"""DistributedOptimizer in one process: validation, delegation to the inner optimizer, accumulation, loss scaling and
serialization (the reduction itself: tests/unit/reduce/)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.training.optimizer import DistributedLossScaleOptimizer, DistributedOptimizer

from ..helpers import small_model


@pytest.mark.parametrize(
    "value, error, match",
    [
        ("adam", TypeError, "Keras 3 optimizer instance"),
        (keras.optimizers.SGD, TypeError, "not a class"),
        (object(), TypeError, "Received: optimizer="),
        (None, TypeError, "Received: optimizer=None"),
    ],
)
def test_rejects_non_optimizers(value, error, match):
    with pytest.raises(error, match=match):
        DistributedOptimizer(value)


def test_rejects_wrapping_twice(hvd):
    opt = DistributedOptimizer(keras.optimizers.SGD())
    with pytest.raises(ValueError, match="already a DistributedOptimizer"):
        DistributedOptimizer(opt)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"op": 7}, "Received: op=7"),
        ({"backward_passes_per_step": 0}, "Received: backward_passes_per_step=0"),
        ({"backward_passes_per_step": 1.5}, "Received: backward_passes_per_step=1.5"),
        ({"compression": "gzip"}, "Received: compression='gzip'"),
        ({"gradient_predivide_factor": 0.0}, "Received: gradient_predivide_factor=0.0"),
        ({"groups": 0}, "Received: groups=0"),
        ({"groups": "all"}, "Received: groups='all'"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DistributedOptimizer(keras.optimizers.SGD(), **kwargs)


def test_predivide_requires_average():
    with pytest.raises(ValueError, match="requires op=hvdkeras.Average"):
        DistributedOptimizer(keras.optimizers.SGD(), op=C.Sum, gradient_predivide_factor=2.0)


def test_delegates_learning_rate_iterations_and_hyperparameters(hvd):
    inner = keras.optimizers.SGD(0.1, momentum=0.9)
    opt = DistributedOptimizer(inner)
    assert opt.inner_optimizer is inner
    assert opt.momentum == 0.9
    assert float(opt.learning_rate) == pytest.approx(0.1)
    opt.learning_rate = 0.5
    assert float(inner.learning_rate) == pytest.approx(0.5)
    model = small_model()
    opt.build(model.trainable_variables)
    assert opt.iterations is inner.iterations
    assert all(any(v is w for w in opt.variables) for v in inner.variables)


def _keras_hyperparameters() -> set:
    """The constructor parameters of every keras.optimizers class beyond the base optimizer's (and
    LossScaleOptimizer's), the hyperparameters a DistributedOptimizer reads on its inner optimizer."""
    import inspect

    from keras.src.optimizers.base_optimizer import BaseOptimizer

    def named(cls):
        return {name for name, p in inspect.signature(cls.__init__).parameters.items()
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}

    own = named(BaseOptimizer) | named(keras.optimizers.LossScaleOptimizer) | {"optimizer_map"}
    names = set()
    for value in vars(keras.optimizers).values():
        if isinstance(value, type) and issubclass(value, keras.optimizers.Optimizer):
            names |= named(value) - own
    return names


def test_every_keras_hyperparameter_and_option_is_a_property_written_in_the_class():
    """The properties are written out in the class body (found by go-to-definition, nothing computed or raised at
    import). A Keras release with a new hyperparameter fails here, not in a user's import."""
    import dataclasses

    from hvdkeras.reduce.options import ReductionOptions

    body = vars(DistributedOptimizer)
    hyper = _keras_hyperparameters()
    assert "momentum" in hyper and "beta_1" in hyper and "rho" in hyper  # the scan itself works
    missing = sorted(n for n in hyper if not isinstance(body.get(n), property))
    assert not missing, f"keras.optimizers hyperparameters with no property on DistributedOptimizer: {missing}"
    options = [f.name for f in dataclasses.fields(ReductionOptions)]
    assert all(isinstance(body.get(n), property) for n in options)
    # None of them hides what Keras's optimizers (or a LossScaleOptimizer) have of their own.
    mine = [n for n, v in body.items() if isinstance(v, property) and n in hyper | set(options)]
    for base in (keras.optimizers.Optimizer, keras.optimizers.LossScaleOptimizer):
        assert not [n for n in mine if hasattr(base, n)], base
    # Each option reads the optimizer's options; each hyperparameter reads and sets the inner optimizer's.
    opt = DistributedOptimizer(keras.optimizers.Adam(beta_1=0.8), bucket_bytes=1024)
    assert opt.bucket_bytes == 1024 == opt.options.bucket_bytes and opt.op == opt.options.op
    with pytest.raises(AttributeError):
        opt.bucket_bytes = 1
    assert opt.beta_1 == 0.8
    opt.beta_1 = 0.7
    assert opt.inner_optimizer.beta_1 == 0.7


def test_schedules_run_on_the_inner_iterations(hvd):
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    opt = DistributedOptimizer(keras.optimizers.SGD(schedule))
    model = small_model()
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    opt.apply(grads, model.trainable_variables)
    opt.apply(grads, model.trainable_variables)
    assert int(opt.iterations) == 2
    assert float(opt.learning_rate) == pytest.approx(0.025)


def test_apply_reduces_all_dense_gradients_in_one_call(monkeypatch, fake_seam):
    seam = fake_seam.second_worker()
    model = small_model()
    before = [v.numpy() for v in model.trainable_variables]
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    opt.apply_gradients(zip(grads, model.trainable_variables))
    assert seam.calls == [("grouped_allreduce", 2, C.Average)]
    for b, v in zip(before, model.trainable_variables):
        np.testing.assert_allclose(v.numpy(), b - 0.1 * 2.0, rtol=1e-6)


@pytest.mark.parametrize("average, expected", [(False, 12.0), (True, 4.0)])
def test_backward_passes_accumulate_and_communicate_every_k(monkeypatch, average, expected, fake_seam):
    seam = fake_seam.second_worker()
    model = small_model()
    before = [v.numpy() for v in model.trainable_variables]
    kwargs = {} if not average else {"average_aggregated_gradients": True}
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=3, **kwargs)
    for k in range(3):
        grads = [tf.fill(v.shape, float(k + 1)) for v in model.trainable_variables]
        opt.apply(grads, model.trainable_variables)
        assert len(seam.calls) == (1 if k == 2 else 0)
    # Horovod's default sums the passes (1+2+3 = 6), averaging gives 2; the fake second worker doubles it.
    for b, v in zip(before, model.trainable_variables):
        np.testing.assert_allclose(v.numpy(), b - 0.1 * expected, rtol=1e-6)
    assert int(opt.iterations) == 3  # Horovod's meaning: backward passes, not updates


class _RateOfStep(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 0.1 * (tf.cast(step, "float32") + 1.0)

    def get_config(self):
        return {}


def test_backward_passes_count_as_iterations_and_schedules_see_that_count(monkeypatch, fake_seam):
    """Horovod's test_gradient_aggregation / test_load_model_custom_optimizers under k=2, on Keras 3: every
    backward pass adds 1 to `iterations`, and the schedule is evaluated at the count of the applying pass."""
    fake_seam.second_worker()
    model = small_model()
    before = [v.numpy() for v in model.trainable_variables]
    opt = DistributedOptimizer(keras.optimizers.SGD(_RateOfStep()), backward_passes_per_step=2)
    seen = []
    for _ in range(4):
        opt.apply([tf.ones(v.shape) for v in model.trainable_variables], model.trainable_variables)
        seen.append(int(opt.iterations))
    assert seen == [1, 2, 3, 4]
    # The updates happen at passes 2 and 4, with iterations 1 and 3 before them: rates 0.2 and 0.4. Each
    # sums 2 passes of 1, doubled by the fake second worker: 4.
    for b, v in zip(before, model.trainable_variables):
        np.testing.assert_allclose(v.numpy(), b - (0.2 + 0.4) * 4, rtol=1e-6)


def test_mixed_float16_policy_gives_a_loss_scale_optimizer(hvd):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(opt, DistributedLossScaleOptimizer) and isinstance(opt, DistributedOptimizer)
    # The loss scaling is held, not inherited: the inner optimizer is the LossScaleOptimizer.
    assert isinstance(opt.inner_optimizer, keras.optimizers.LossScaleOptimizer)
    assert not isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert float(opt.inner_optimizer.inner_optimizer.learning_rate) == pytest.approx(0.1)
    # compile under mixed_float16 wraps any other optimizer in a LossScaleOptimizer: this one comes back as it is.
    assert keras.optimizers.LossScaleOptimizer(opt) is opt
    assert type(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())) is keras.optimizers.LossScaleOptimizer
    assert opt.initial_scale == opt.inner_optimizer.initial_scale == 2.0**15
    wrapped = DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))
    assert isinstance(wrapped, DistributedLossScaleOptimizer)
    assert type(DistributedOptimizer(keras.optimizers.Adam())) is DistributedOptimizer


def test_no_metaclass_no_diamond_and_no_call_that_skips_along_the_mro():
    """DistributedOptimizer is a plain Keras optimizer class; the loss-scale variant inherits from it alone."""
    import inspect

    from hvdkeras.training import optimizer as module

    assert type(DistributedOptimizer) is type(keras.optimizers.Optimizer)
    assert DistributedLossScaleOptimizer.__bases__ == (DistributedOptimizer,)
    assert not issubclass(DistributedLossScaleOptimizer, keras.optimizers.LossScaleOptimizer)
    source = inspect.getsource(module)
    for skip in ("Optimizer.__init__(self", "Optimizer.build(self", "metaclass="):
        assert skip not in source, skip


def test_loss_scaling_by_composition_checks_the_reduced_gradients(hvd):
    """The held LossScaleOptimizer checks what the reduction gave: non-finite reduced gradients skip the step and
    halve the scale, finite ones update and count (one rank's overflow on two workers: test_optimizer_2w)."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = small_model()
        opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    opt.build(model.trainable_variables)
    before = [v.numpy().copy() for v in model.trainable_variables]
    grads = [tf.ones(v.shape) for v in model.trainable_variables]
    grads[0] = tf.fill(model.trainable_variables[0].shape, float("inf"))
    opt.apply(grads, model.trainable_variables)
    assert float(opt.dynamic_scale.numpy()) == 2.0**14
    for b, v in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(v.numpy(), b)
    opt.apply([tf.ones(v.shape) for v in model.trainable_variables], model.trainable_variables)
    assert float(opt.dynamic_scale.numpy()) == 2.0**14 and int(opt.step_counter.numpy()) == 1
    assert not np.array_equal(model.trainable_variables[0].numpy(), before[0])


def test_xla_context_gives_a_clear_error(hvd):
    model = small_model()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
    opt.build(model.trainable_variables)

    @tf.function(jit_compile=True)
    def step():
        opt.apply([tf.ones_like(v) for v in model.trainable_variables], model.trainable_variables)

    with pytest.raises(RuntimeError, match="cannot be compiled by XLA"):
        step()


def test_variables_are_the_inner_optimizers(hvd):
    """As in Keras and Horovod: no extra wrapper variables (accumulators only with k > 1)."""
    model = small_model()
    inner = keras.optimizers.Adam(0.01)
    opt = DistributedOptimizer(inner)
    opt.build(model.trainable_variables)
    assert len(opt.variables) == len(inner.variables) == 1 + 1 + 2 * len(model.trainable_variables)
    assert all(a is b for a, b in zip(opt.variables, inner.variables))
    k2 = DistributedOptimizer(keras.optimizers.Adam(0.01), backward_passes_per_step=2)
    k2.build(model.trainable_variables)
    assert len(k2.variables) == len(k2.inner_optimizer.variables) + 1 + len(model.trainable_variables)


def test_partial_distributed_optimizer_takes_layers_built_later(monkeypatch, fake_seam):
    fake_seam.second_worker()
    head = keras.layers.Dense(2)
    opt = hvdkeras_module().PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=head)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), head])  # head built now, after opt
    out = opt.reduce_gradients([tf.ones_like(v) for v in model.trainable_variables], model.trainable_variables)
    assert [float(np.max(g)) for g in out] == [2.0, 2.0, 0.5, 0.5]
    with pytest.raises(ValueError, match="must be Keras layers. Received: local_layers="):
        hvdkeras_module().PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=["dense"])


def test_horovod_positional_order_and_deprecated_num_groups(monkeypatch, fake_seam):
    fake_seam.second_worker()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), "dist", "", "", hvdkeras_module().Compression.fp16, False,
                               1.0, C.Sum, 2, True, 3)
    assert (opt.name, opt.compression, opt.op, opt.backward_passes_per_step, opt.average_aggregated_gradients,
            opt.groups) == ("dist", hvdkeras_module().Compression.fp16, C.Sum, 2, True, 3)
    with pytest.raises(ValueError, match="not both"):
        DistributedOptimizer(keras.optimizers.SGD(0.1), num_groups=2, groups=2)
    with pytest.raises(TypeError, match="must be an hvdkeras.ProcessSet. Received: process_set=\\[0\\]"):
        DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=[0])


def hvdkeras_module():
    import hvdkeras

    return hvdkeras


@pytest.mark.parametrize("value", [-1, 1.5, "1MB", True])
def test_bad_bucket_sizes_say_what_was_received(monkeypatch, value):
    with pytest.raises(ValueError, match=r"bucket_bytes` must be an integer number of bytes >= 0.*Received: "
                                         rf"bucket_bytes={value!r}"):
        DistributedOptimizer(keras.optimizers.SGD(), bucket_bytes=value)
    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", str(value))
    if not isinstance(value, bool):
        with pytest.raises(ValueError, match=r"Received: HVDKERAS_BUCKET_BYTES="):
            DistributedOptimizer(keras.optimizers.SGD())


def test_non_finite_learning_rate(hvd):
    with pytest.raises(ValueError, match="Received: learning_rate=nan"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(float("nan")))
    with pytest.raises(ValueError, match="Received: learning_rate=inf"):
        hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(float("inf"))))


def test_calling_the_class_shows_horovods_parameters():
    import inspect

    names = list(inspect.signature(DistributedOptimizer).parameters)
    assert names[:3] == ["optimizer", "name", "device_dense"] and names[-3:] == ["bucket_bytes",
                                                                                 "shard_optimizer_state", "reducer"]
    assert names == [n for n in inspect.signature(DistributedOptimizer.__init__).parameters if n != "self"]


def test_the_loss_is_scaled_by_the_inner_optimizers_loss_scale_factor():
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1, loss_scale_factor=4.0))
    assert float(opt.scale_loss(tf.constant(1.5))) == 6.0


def test_the_loss_scale_passthrough_is_a_patch_that_uninstalls(hvd):
    from hvdkeras import patches

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
        assert patches.installed("loss_scale_passthrough")
        assert keras.optimizers.LossScaleOptimizer(opt) is opt
        patches.uninstall("loss_scale_passthrough")
        wrapped = keras.optimizers.LossScaleOptimizer(opt)  # Keras's own behaviour again: a second loss scaling
        assert type(wrapped) is keras.optimizers.LossScaleOptimizer and wrapped.inner_optimizer is opt
        plain = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8.0)
        assert type(plain) is keras.optimizers.LossScaleOptimizer and plain.initial_scale == 8.0
    finally:
        keras.mixed_precision.set_global_policy("float32")
        patches.uninstall("loss_scale_passthrough")
