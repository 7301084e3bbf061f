"""DistributedOptimizer in one process: validation, delegation, serialization, and the reduction logic
against a faked collectives seam."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdkeras import _collectives as C
from hvdkeras.optimizer import DistributedLossScaleOptimizer, DistributedOptimizer


def small_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


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


def test_schedules_run_on_the_inner_iterations(hvd):
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    opt = DistributedOptimizer(keras.optimizers.SGD(schedule))
    model = small_model()
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    opt.apply(grads, model.trainable_variables)
    opt.apply(grads, model.trainable_variables)
    assert int(opt.iterations) == 2
    assert float(opt.learning_rate) == pytest.approx(0.025)


class FakeSeam:
    """Pretends a second worker exists whose gradients are 3x ours: the average is then 2x ours."""

    def __init__(self, monkeypatch):
        self.calls = []
        monkeypatch.setattr(C, "grouped_allreduce", self.grouped_allreduce)
        monkeypatch.setattr(C, "allgather", self.allgather)
        monkeypatch.setattr(C, "size", lambda: 2)
        monkeypatch.setattr(C, "size_tensor", lambda process_set=C.global_process_set: tf.constant(2))

    def grouped_allreduce(self, tensors, op=C.Average, prescale_factor=1.0, postscale_factor=1.0, name=None,
                          process_set=C.global_process_set):
        self.calls.append(("grouped_allreduce", len(tensors), op))
        self.process_set = process_set
        total = [(t * prescale_factor + 3 * t * prescale_factor) * postscale_factor for t in tensors]
        return [s / 2 if op == C.Average else s for s in total]

    def allgather(self, tensor, name=None, process_set=C.global_process_set):
        self.calls.append(("allgather",))
        return tf.concat([tensor, tensor], axis=0)


def test_apply_reduces_all_dense_gradients_in_one_call(monkeypatch):
    seam = FakeSeam(monkeypatch)
    model = small_model()
    before = [v.numpy() for v in model.trainable_variables]
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    opt.apply_gradients(zip(grads, model.trainable_variables))
    assert seam.calls == [("grouped_allreduce", 2, C.Average)]
    for b, v in zip(before, model.trainable_variables):
        np.testing.assert_allclose(v.numpy(), b - 0.1 * 2.0, rtol=1e-6)


def test_sum_and_predivide(monkeypatch):
    seam = FakeSeam(monkeypatch)
    model = small_model()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), op=C.Sum)
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    reduced = opt.reduce_gradients(grads, model.trainable_variables)
    np.testing.assert_allclose(reduced[0].numpy(), 4.0)
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), gradient_predivide_factor=4.0)
    reduced = opt.reduce_gradients(grads, model.trainable_variables)
    np.testing.assert_allclose(reduced[0].numpy(), 2.0, rtol=1e-6)
    assert len(seam.calls) == 2


def test_fp16_compression_sends_half_and_restores_dtype(monkeypatch):
    seen = []

    def fake(tensors, **kwargs):  # noqa: ARG001
        seen.extend(t.dtype for t in tensors)
        return tensors

    monkeypatch.setattr(C, "grouped_allreduce", fake)
    from hvdkeras import Compression

    model = small_model()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), compression=Compression.fp16)
    out = opt.reduce_gradients([tf.ones_like(v) for v in model.trainable_variables], model.trainable_variables)
    assert seen == [tf.float16, tf.float16]
    assert [t.dtype for t in out] == [tf.float32, tf.float32]


def test_sparse_gradients_are_allgathered_and_averaged(monkeypatch):
    seam = FakeSeam(monkeypatch)
    var = keras.Variable(np.zeros((5, 2), "float32"))
    grad = tf.IndexedSlices(tf.ones((2, 2)), tf.constant([1, 3]), dense_shape=tf.constant([5, 2]))
    opt = DistributedOptimizer(keras.optimizers.SGD(1.0))
    (out,) = opt.reduce_gradients([grad], [var])
    assert isinstance(out, tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(out).numpy()[[1, 3]], 1.0)  # 2 copies of 1, divided by 2
    assert seam.calls == [("allgather",), ("allgather",)]
    dense = DistributedOptimizer(keras.optimizers.SGD(1.0), sparse_as_dense=True)
    (out,) = dense.reduce_gradients([grad], [var])
    assert not isinstance(out, tf.IndexedSlices)
    assert seam.calls[-1][0] == "grouped_allreduce"


@pytest.mark.parametrize("average, expected", [(False, 12.0), (True, 4.0)])
def test_backward_passes_accumulate_and_communicate_every_k(monkeypatch, average, expected):
    seam = FakeSeam(monkeypatch)
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


def test_backward_passes_count_as_iterations_and_schedules_see_that_count(monkeypatch):
    """Horovod's test_gradient_aggregation / test_load_model_custom_optimizers under k=2, on Keras 3: every
    backward pass adds 1 to `iterations`, and the schedule is evaluated at the count of the applying pass."""
    FakeSeam(monkeypatch)
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
    assert isinstance(opt, DistributedLossScaleOptimizer)
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert isinstance(opt.inner_optimizer, keras.optimizers.LossScaleOptimizer)
    wrapped = DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))
    assert isinstance(wrapped, DistributedLossScaleOptimizer)
    assert type(DistributedOptimizer(keras.optimizers.Adam())) is DistributedOptimizer


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


def test_local_variables_are_not_reduced_and_scaled_like_horovod(monkeypatch):
    seam = FakeSeam(monkeypatch)
    model = small_model()
    kernel, bias = model.trainable_variables[-2:]
    for scale, factor in ((True, 0.5), (False, 1.0)):
        opt = DistributedOptimizer(keras.optimizers.SGD(1.0), scale_local_gradients=scale)
        opt.register_local_var(bias)
        grads = [tf.ones_like(v) for v in model.trainable_variables]
        out = opt.reduce_gradients(grads, model.trainable_variables)
        np.testing.assert_allclose(out[-1].numpy(), np.full(bias.shape, factor))  # local: grad / size, no seam
        np.testing.assert_allclose(out[-2].numpy(), np.full(kernel.shape, 2.0))   # reduced: 2x ours (fake)
    assert seam.calls[-1] == ("grouped_allreduce", len(grads) - 1, C.Average)


def test_partial_distributed_optimizer_takes_layers_built_later(monkeypatch):
    FakeSeam(monkeypatch)
    head = keras.layers.Dense(2)
    opt = hvdkeras_module().PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=head)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), head])  # head built now, after opt
    out = opt.reduce_gradients([tf.ones_like(v) for v in model.trainable_variables], model.trainable_variables)
    assert [float(np.max(g)) for g in out] == [2.0, 2.0, 0.5, 0.5]
    with pytest.raises(ValueError, match="must be Keras layers. Received: local_layers="):
        hvdkeras_module().PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=["dense"])


def test_horovod_positional_order_and_deprecated_num_groups(monkeypatch):
    FakeSeam(monkeypatch)
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


def stack(widths=(4, 8, 16, 2)):
    """Dense layers of known sizes: kernel k has widths[k] * widths[k + 1] float32 entries."""
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((widths[0],))] + [keras.layers.Dense(w) for w in widths[1:]])


class RecordingSeam:
    """Records each grouped allreduce's name and the variables (by shape) it reduces; reduces nothing."""

    def __init__(self, monkeypatch):
        self.calls = []
        monkeypatch.setattr(C, "grouped_allreduce", self.grouped_allreduce)
        monkeypatch.setattr(C, "size", lambda: 2)

    def grouped_allreduce(self, tensors, name=None, **kwargs):  # noqa: ARG002
        self.calls.append((name, [tuple(t.shape) for t in tensors]))
        return [tf.identity(t) for t in tensors]


def test_gradients_are_reduced_in_buckets_in_backward_order(monkeypatch):
    seam = RecordingSeam(monkeypatch)
    model = stack()  # kernels 4x8 (128 B), 8x16 (512 B), 16x2 (128 B); biases 32, 64, 8 B
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    DistributedOptimizer(keras.optimizers.SGD(0.1), bucket_bytes=130).reduce_gradients(grads, model.trainable_variables)
    # From the last layer to the first; a bucket closes once it holds >= 130 bytes.
    assert seam.calls == [("hvdkeras.gradients.0", [(2,), (16, 2)]),
                          ("hvdkeras.gradients.1", [(16,), (8, 16)]),
                          ("hvdkeras.gradients.2", [(8,), (4, 8)])]
    seam.calls.clear()
    DistributedOptimizer(keras.optimizers.SGD(0.1), bucket_bytes=0).reduce_gradients(grads, model.trainable_variables)
    assert [len(shapes) for _, shapes in seam.calls] == [6]
    seam.calls.clear()
    DistributedOptimizer(keras.optimizers.SGD(0.1)).reduce_gradients(grads, model.trainable_variables)
    assert len(seam.calls) == 1, "the default (64 KiB) holds this whole model in one bucket"
    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", "1")
    seam.calls.clear()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1))
    opt.reduce_gradients(grads, model.trainable_variables)
    assert opt.bucket_bytes == 1 and len(seam.calls) == 6
    assert DistributedOptimizer.from_config(opt.get_config()).bucket_bytes == 1


@pytest.mark.parametrize("value", [-1, 1.5, "1MB", True])
def test_bad_bucket_sizes_say_what_was_received(monkeypatch, value):
    with pytest.raises(ValueError, match=r"bucket_bytes` must be an integer number of bytes >= 0.*Received: "
                                         rf"bucket_bytes={value!r}"):
        DistributedOptimizer(keras.optimizers.SGD(), bucket_bytes=value)
    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", str(value))
    if not isinstance(value, bool):
        with pytest.raises(ValueError, match=r"Received: HVDKERAS_BUCKET_BYTES="):
            DistributedOptimizer(keras.optimizers.SGD())


def ancestors(tensors) -> set:
    seen, todo = set(), [t.op for t in tensors]
    while todo:
        op = todo.pop()
        if op.name not in seen:
            seen.add(op.name)
            todo.extend(t.op for t in op.inputs)
            todo.extend(op.control_inputs)
    return seen


@pytest.mark.parametrize("bucket_bytes", [130, 0])
def test_a_bucket_can_start_before_the_rest_of_the_backward_pass_exists(monkeypatch, bucket_bytes):
    """The overlap is structural: in the traced train step, the last layer's bucket depends on none of the
    first layer's gradient ops, so the runtime can send it while it still computes them."""
    sent = {}

    def grouped_allreduce(tensors, name=None, **kwargs):  # noqa: ARG001
        sent[name] = list(tensors)
        return [tf.identity(t) for t in tensors]

    monkeypatch.setattr(C, "grouped_allreduce", grouped_allreduce)
    model = stack()
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), bucket_bytes=bucket_bytes)
    opt.build(model.trainable_variables)
    first_kernel_grad = {}

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        first_kernel_grad["op"] = grads[0].op.name
        opt.apply(grads, model.trainable_variables)

    step.get_concrete_function(tf.TensorSpec((8, 4)), tf.TensorSpec((8, 2)))
    last_bucket_needs = ancestors(sent["hvdkeras.gradients.0"])
    if bucket_bytes:
        assert first_kernel_grad["op"] not in last_bucket_needs
        assert len(sent) == 3
    else:
        assert first_kernel_grad["op"] in last_bucket_needs and len(sent) == 1
