"""Keras speaks once: on ranks other than 0, a wrapped script's Keras summary, plots, messages, warnings and log
records are silent; errors and the script's own output are not (the rank faked)."""

import logging
import warnings

import keras
import pytest

from hvdkeras.training import keras_output


@pytest.fixture
def quiet(hvd):
    assert keras_output.install()
    yield
    keras_output.uninstall()


def model():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


@pytest.mark.parametrize("rank", [0, 1])
def test_summary_and_keras_messages_on_rank_zero_only(quiet, monkeypatch, capsys, rank, fake_seam):
    from keras.src.utils import io_utils

    fake_seam.set(rank=rank)
    model().summary()
    io_utils.print_msg("Epoch 3: early stopping")
    print("the script's own line")
    out = capsys.readouterr().out
    assert ("Total params" in out and "early stopping" in out) == (rank == 0)
    assert "the script's own line" in out


def test_plot_model_writes_nothing_on_other_ranks(quiet, monkeypatch, tmp_path, fake_seam):
    import keras._tf_keras.keras as tf_keras

    fake_seam.set(rank=1)
    assert keras.utils.plot_model(model(), to_file=str(tmp_path / "m.png")) is None
    assert tf_keras.utils.plot_model(model(), to_file=str(tmp_path / "n.png")) is None
    assert list(tmp_path.iterdir()) == []


def _keras_warns():
    from keras.src.backend.tensorflow import trainer  # a module of Keras's own, where its warning starts

    exec(compile("warnings.warn('The model does not have any trainable weights.')", trainer.__file__, "exec"),
         {"warnings": warnings, "__name__": trainer.__name__})


@pytest.mark.parametrize("rank", [0, 1])
def test_keras_warnings_and_log_records_on_rank_zero_only(quiet, monkeypatch, caplog, rank, fake_seam):
    fake_seam.set(rank=rank)
    shown = []
    # Where Python's own showwarning (which the patch calls) writes a warning: recorded here instead.
    monkeypatch.setattr(warnings, "_showwarnmsg_impl", lambda message: shown.append(str(message.message)))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        _keras_warns()
        warnings.warn("the script's own warning", stacklevel=1)
    assert shown == (["The model does not have any trainable weights.", "the script's own warning"] if rank == 0
                     else ["the script's own warning"])
    with caplog.at_level(logging.INFO):
        logging.getLogger("tensorflow").warning("5 out of the last 5 calls triggered tf.function retracing")
        logging.getLogger("absl").info("a message of Keras's")
        logging.getLogger("tensorflow").error("an error is always shown")
    messages = [r.getMessage() for r in caplog.records]
    assert ("a message of Keras's" in messages) == (rank == 0)
    assert ("5 out of the last 5 calls triggered tf.function retracing" in messages) == (rank == 0)
    assert "an error is always shown" in messages


def test_the_origin_of_a_warning_is_the_code_that_raised_it():
    assert keras_output.is_quiet_module("keras.src.trainers.trainer")
    assert keras_output.is_quiet_module("tensorflow") and not keras_output.is_quiet_module("kerasnlp_mine")
    assert not keras_output.is_quiet_module("__main__")


def test_uninstall_restores_everything(hvd):
    from keras.src.utils import io_utils

    before = (keras.Model.summary, io_utils.print_msg, keras.utils.plot_model, warnings.showwarning)
    keras_output.install()
    assert keras_output.install() is False  # once
    keras_output.uninstall()
    assert (keras.Model.summary, io_utils.print_msg, keras.utils.plot_model, warnings.showwarning) == before
    assert keras_output._FILTER not in logging.getLogger("tensorflow").filters
