"""hvdkeras.callbacks.metrics: metric averaging over the workers, with a faked seam."""

import numpy as np


def test_metric_average_averages_a_custom_steps_plain_logs(hvd, monkeypatch, fake_seam):
    """A custom train_step's plain values (a GAN's d_loss) are averaged over the workers in the epoch's logs;
    values that are the global metric results are left as they are."""
    import hvdkeras
    from hvdkeras import _collectives as C

    fake_seam.set(size=2)
    reduced = []

    def allreduce(tensor, op=C.Average, name=None, **kwargs):
        reduced.append(name)
        return tensor + 1.0  # the other worker's values are ours + 2

    fake_seam.set(allreduce=allreduce)
    cb = hvdkeras.callbacks.MetricAverageCallback()
    cb._global = {"accuracy": np.float32(0.5)}
    logs = {"d_loss": 1.0, "accuracy": 0.5, "learning_rate": 0.1, "images": np.zeros(3)}
    cb.on_epoch_end(0, logs)
    assert logs == {"d_loss": 2.0, "accuracy": 0.5, "learning_rate": 0.1, "images": logs["images"]}
    assert reduced == ["hvdkeras.logs.epoch"]
    test_logs = {"loss": 3.0}
    cb.on_test_end(test_logs)  # an evaluation's plain values, then fit's "val_" copy of them stays
    epoch_logs = {"loss": 1.0, "val_loss": test_logs["loss"]}
    cb.on_epoch_end(1, epoch_logs)
    assert test_logs == {"loss": 4.0} and epoch_logs == {"loss": 2.0, "val_loss": 4.0}
