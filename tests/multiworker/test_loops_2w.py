"""Unmodified custom training loops under `hvdkeras run -np 2` train one model (workers/loops_script.py).

The script seeds each rank differently and feeds each rank different data, with dropout, so that without
hvdkeras the ranks would end with two different models; the corpus (test_corpus_2w.py) checks the loops of
seeded scripts against one process.
"""

import json

import pytest

from launch import VENV_BIN, WORKERS, run_command


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("loops")
    job = run_command([str(VENV_BIN / "hvdkeras"), "run", "-np", "2", str(WORKERS / "loops_script.py"), str(out)],
                      out, timeout=300)
    if job.returncode != 0:
        job.fail(f"hvdkeras run exited with {job.returncode}")
    results = {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}
    results["output"] = job.output
    return results


@pytest.mark.parametrize("key", ["numpy_weights", "tf_function_weights", "tf_function_opt", "eager_weights",
                                 "mixed_weights", "train_on_batch_weights"])
def test_both_ranks_hold_one_model(ranks, key):
    assert ranks[0][key] == ranks[1][key]


def test_a_loops_dataset_is_split_and_its_keras_metrics_are_global(ranks):
    for r in (0, 1):
        assert ranks[r]["split_rows"] == [8, 8, 8]  # each worker its half of every batch of 16
        assert ranks[r]["split_own_rows"] == 24.0
        assert ranks[r]["split_global_rows"] == 48.0  # Sum: all the rows, as one process counts them
        assert ranks[r]["split_global_mean"] == pytest.approx(47.5)  # the mean of 0..95, one process's


def test_an_overflow_on_one_rank_is_skipped_by_both(ranks):
    for r in (0, 1):
        scales = ranks[r]["mixed_scales"]
        assert scales[1] == scales[0] / 2 and scales[2] == scales[1], scales
        assert ranks[r]["mixed_iterations"] == 2  # the overflowing step was skipped


def test_an_update_inside_xla_is_refused_with_what_to_do(ranks):
    for r in (0, 1):
        error = ranks[r]["xla_error"]
        assert error and "inside tf.function(jit_compile=True)" in error and "jit_compile=False" in error


def test_the_unsplit_data_is_said_once(ranks):
    lines = [line for line in ranks["output"].splitlines() if "the loop's data is not split" in line]
    assert len(lines) == 1 and lines[0].startswith("[0]"), lines


def test_a_mirrored_strategy_loop_splits_the_global_batch_and_trains_as_one_process(ranks):
    # experimental_distribute_dataset: each worker its 8 rows of every batch of 16; the Keras loss's division
    # by the replicas counts both workers, the gradients are summed, and reduce(SUM) adds the workers' losses.
    for r in (0, 1):
        got = ranks[r]["mirrored"]
        assert got["rows"] == [[8], [8]]
        assert got["losses"] == pytest.approx(got["expected_losses"], rel=1e-5)
        assert got["weights"] == pytest.approx(got["expected_weights"], rel=1e-5)


def test_distribute_datasets_from_function_counts_every_workers_pipelines_and_replicas(ranks):
    # The input context: 2 pipelines and 2 replicas in all, this worker's id, a per-replica batch of 16 / 2;
    # compute_average_loss's default divides by the rows of both workers (13 in the uneven last batch), and
    # reduce(MEAN, axis=0) is the mean over every row.
    for r in (0, 1):
        got = ranks[r]["from_function"]
        assert got["contexts"] == [[2, r, 2, 8]]
        assert got["losses"] == pytest.approx(got["expected_losses"], rel=1e-5)
        assert got["weights"] == pytest.approx(got["expected_weights"], rel=1e-5)


def test_a_strategy_loss_averaged_over_the_replicas_rows_is_said_once(ranks):
    assert ranks[0]["local_mean_weights"] == ranks[1]["local_mean_weights"]
    lines = [line for line in ranks["output"].splitlines() if "none of tf.distribute's scalings" in line]
    assert len(lines) == 1 and lines[0].startswith("[0]"), lines
