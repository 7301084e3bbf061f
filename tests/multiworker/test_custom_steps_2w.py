"""Models with their own train_step (custom steps, compute_loss, no call(), a GAN) through the explicit API,
on 2 real Gloo workers (workers/custom_steps_worker.py)."""

import pytest

SCENARIOS = ("custom_steps",)  # run in the one scenarios launch (conftest.py), as `job`
KINDS = ["custom_step", "compute_loss", "autoencoder"]


@pytest.mark.parametrize("kind", KINDS)
def test_custom_step_models_train_like_one_process_from_rank0(job, kind):
    """Each rank started from its own seed; the autoencoder's variables exist only once its first step is
    traced. All end where one process ends that trained rank 0's model on the global batches."""
    for r in (0, 1):
        assert job.results[r][f"{kind}_max_abs_diff"] <= 1e-5
    assert job.results[0][f"{kind}_digest"] == job.results[1][f"{kind}_digest"]
    print(f"{kind}: max abs diff to one process {max(job.results[r][f'{kind}_max_abs_diff'] for r in (0, 1)):.1e}")


@pytest.mark.parametrize("kind", KINDS)
def test_custom_step_logs_are_global_on_every_rank(job, kind):
    """The custom step's logs (its own trackers, here reported by Keras as plain values) are the same on both
    ranks and those of one process on the global batches."""
    logs = [job.results[r][f"{kind}_logs"] for r in (0, 1)]
    assert logs[0] == logs[1]
    one = job.results[0][f"{kind}_one_process_logs"]
    assert sorted(one) == sorted(logs[0])
    for key, values in one.items():
        assert logs[0][key] == pytest.approx(values, rel=1e-5), key


def test_gan_with_distributed_optimizers_stays_one_model(job):
    assert job.results[0]["gan_digest"] == job.results[1]["gan_digest"]
    assert job.results[0]["gan_logs"] == job.results[1]["gan_logs"]  # its plain d_loss / g_loss, averaged
    assert set(job.results[0]["gan_logs"]) == {"d_loss", "g_loss"}


def test_gan_with_plain_optimizers_fails_after_its_first_epoch_naming_them(job):
    for r in (0, 1):
        message = job.results[r]["gan_undistributed_error"]
        assert message is not None, "two workers applied local gradients and nothing said so"
        assert "weights differ after epoch 1" in message
        assert "d_optimizer (Adam), g_optimizer (Adam)" in message and "hvdkeras.DistributedOptimizer" in message


def test_a_model_that_cannot_be_built_before_step_one_gets_a_clear_error(job):
    for r in (0, 1):
        message = job.results[r]["not_traceable_error"]
        assert message.startswith("hvdkeras could not create the variables of model 'not_traceable'")
        assert "calling it on a batch" in message
    # Built as the message says, it trains as one model.
    assert job.results[0]["not_traceable_digest"] == job.results[1]["not_traceable_digest"]
