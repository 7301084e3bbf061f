"""Keras 3 scripts in the style of the Keras guides (tests/multiworker/corpus), run unmodified: each as one
plain Keras process and under `hvdkeras run -np 2`.

workers/corpus_runner.py runs all the scripts in turn in one process (one launch per side, so the suite
pays for two TensorFlow starts, not forty). For every script:
- it exits cleanly on one process and on both workers;
- the workers leave the same files as one process, and rank 1 writes none of them;
- progress is printed by rank 0 only;
- both ranks end with identical weights;
- the two workers' final loss is at most LOSS_FACTOR times one process's, plus LOSS_SLACK;
- Keras speaks once: rank 1 prints no model summary, none of Keras's own messages or warnings (one process
  prints them);
- under the default batch convention (global: each batch split over the workers, the rate as the script set
  it), the scripts whose training has no randomness of its own (no dropout, noise or batch statistics) end
  with one process's loss, to float tolerance.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from jobcheck import RANK_PREFIX, is_progress

from launch import HERE, VENV_BIN, WORKERS, run_jobs

CORPUS = HERE / "corpus"
PATTERNS = sorted(p.stem for p in CORPUS.glob("*.py"))
LOSS_FACTOR, LOSS_SLACK = 1.25, 0.01
# Training with randomness or batch statistics of its own: dropout, noise, BatchNormalization, a GAN's and a
# VAE's sampling. The rest is deterministic, and under the global batch two workers train as one process.
RANDOM = {"convnet_tf_data", "gan", "vae", "loop_gan"}
# Custom training loops (loop_*.py): the script's own loop, not fit; they print their own lines, "loop: ...",
# on every rank, from Keras metrics (global once hvdkeras splits the loop's data). Horovod's TF2 pattern shards
# the data per worker itself (each worker's batch is the script's, so the global batch is N times it), as
# Horovod documents: it trains one model, but not one process's.
LOOPS = [name for name in PATTERNS if name.startswith("loop_")]
PER_WORKER = {"loop_horovod_tape"}
FIT = [name for name in PATTERNS if name not in LOOPS]
DETERMINISTIC = [name for name in PATTERNS if name not in RANDOM | PER_WORKER]
SAME_LOSS_RTOL = 1e-4
# What only Keras prints: its summary table and a callback's message (standard output), a warning raised in
# Keras's own code (standard error). horovodrun forwards each rank's two streams apart, so a line of standard
# error may land beside another script's markers: warnings are counted over the whole output.
KERAS_PRINTS = ("Total params", "Restoring model weights")
KERAS_WARNS = ("does not have any trainable weights",)


def sections(output: str, ranked: bool) -> dict[tuple[int, str], list[str]]:
    """(rank, script) -> the lines that rank printed between the script's begin and end markers."""
    out: dict[tuple[int, str], list[str]] = {}
    current: dict[int, str | None] = {}
    for line in output.splitlines():
        rank, text = 0, line
        if ranked:
            match = RANK_PREFIX["horovodrun"].match(line)
            if not match:
                continue
            rank, text = int(match.group(1)), line[match.end():]
        marker = re.match(r"^### corpus (\w+) (begin|end)$", text)
        if marker:
            current[rank] = marker.group(1) if marker.group(2) == "begin" else None
        elif current.get(rank):
            out.setdefault((rank, current[rank]), []).append(text)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus")
    runner = str(WORKERS / "corpus_runner.py")
    jobs = run_jobs({
        "one": ([sys.executable, runner, str(base / "one")], base / "one", None),
        "two": ([str(VENV_BIN / "hvdkeras"), "run", "-np", "2", runner, str(base / "two")], base / "two", None),
    }, timeout=900)

    def results(side: str, rank: int) -> dict:
        folder = base / side / "results" / f"rank{rank}"
        return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}

    return {"jobs": jobs, "one": results("one", 0), "two": {r: results("two", r) for r in (0, 1)},
            "one_lines": sections(jobs["one"].output, ranked=False),
            "two_lines": sections(jobs["two"].output, ranked=True)}


def test_the_corpus_covers_the_patterns_users_write():
    assert len(PATTERNS) >= 15
    for needed in ("custom_train_step", "gan", "vae", "add_loss", "sample_and_class_weight", "multi_io",
                   "validation_split", "early_stopping", "reduce_lr_on_plateau", "checkpoint_then_load_model",
                   "fit_in_a_loop", "py_dataset", "steps_per_execution", "mirrored_strategy_checkpoint",
                   "loss_inside_model", "embedding_lstm", "fit_predict_fit", "tf_numpy_layers",
                   "no_trainable_weights", "multi_worker_mirrored_strategy", "one_device_and_default_strategy",
                   "loop_eager", "loop_tf_function", "loop_gan", "loop_strategy_run", "loop_mixed_float16",
                   "loop_numpy_slices", "loop_horovod_tape", "loop_checkpoint_manager",
                   "loop_gradient_accumulation", "loop_clip_by_global_norm"):
        assert needed in PATTERNS


@pytest.mark.parametrize("name", PATTERNS)
def test_script_runs_on_one_process_and_on_two_workers(corpus, name):
    for where, result in [("one process", corpus["one"].get(name))] + [
            (f"rank {r}", corpus["two"][r].get(name)) for r in (0, 1)]:
        if result is None:
            corpus["jobs"]["two" if "rank" in where else "one"].fail(f"{name}: no result from {where}")
        assert result["error"] is None, f"{name} failed on {where}:\n{result['error']}"


@pytest.mark.parametrize("name", PATTERNS)
def test_same_files_as_one_process_written_by_rank0_only(corpus, name):
    one, two = corpus["one"][name], [corpus["two"][r][name] for r in (0, 1)]
    assert two[0]["files"] == one["files"]
    assert two[1]["writes"] == [], f"rank 1 wrote {two[1]['writes']}"


@pytest.mark.parametrize("name", FIT)
def test_progress_printed_once(corpus, name):
    assert any(is_progress(line) for line in corpus["one_lines"].get((0, name), []))
    assert any(is_progress(line) for line in corpus["two_lines"].get((0, name), [])), "rank 0 printed no progress"
    printed = [line for line in corpus["two_lines"].get((1, name), []) if is_progress(line)]
    assert printed == [], f"rank 1 printed progress: {printed[:3]}"


@pytest.mark.parametrize("name", PATTERNS)
def test_both_ranks_end_with_identical_weights(corpus, name):
    assert corpus["two"][0][name]["digest"] == corpus["two"][1][name]["digest"]


@pytest.mark.parametrize("name", PATTERNS)
def test_final_loss_close_to_one_process(corpus, name):
    one, two = corpus["one"][name]["loss"], corpus["two"][0][name]["loss"]
    assert corpus["two"][1][name]["loss"] == two  # the logs are global on every rank
    print(f"{name}: final loss one process {one:.4f}, two workers {two:.4f}")
    assert two <= LOSS_FACTOR * one + LOSS_SLACK, f"{name}: two workers {two:.4f}, one process {one:.4f}"


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_global_batch_trains_as_one_process(corpus, name):
    one, two = corpus["one"][name]["loss"], corpus["two"][0][name]["loss"]
    assert two == pytest.approx(one, rel=SAME_LOSS_RTOL), f"{name}: two workers {two!r}, one process {one!r}"


def _loop_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("loop: ")]


NUMBER = re.compile(r"-?\d+\.\d+")


def _same_numbers(a: list[str], b: list[str], rtol: float) -> bool:
    """The same lines, their decimal numbers equal within `rtol` (the workers sum in another order)."""
    if len(a) != len(b) or [NUMBER.sub("#", x) for x in a] != [NUMBER.sub("#", y) for y in b]:
        return False
    pairs = [(float(x), float(y)) for p, q in zip(a, b) for x, y in zip(NUMBER.findall(p), NUMBER.findall(q))]
    return all(abs(x - y) <= rtol * max(abs(x), abs(y)) + 1e-6 for x, y in pairs)


@pytest.mark.parametrize("name", [n for n in LOOPS if n not in PER_WORKER])
def test_loops_print_the_same_numbers_on_both_ranks(corpus, name):
    # The loop's Keras metrics (its loss tracker, accuracy, validation accuracy) are global on every rank.
    rank0, rank1 = (_loop_lines(corpus["two_lines"].get((r, name), [])) for r in (0, 1))
    assert len(rank0) >= 3 and rank0 == rank1


@pytest.mark.parametrize("name", [n for n in LOOPS if n in DETERMINISTIC])
def test_loops_print_what_one_process_prints(corpus, name):
    one = _loop_lines(corpus["one_lines"].get((0, name), []))
    two = _loop_lines(corpus["two_lines"].get((0, name), []))
    assert len(one) >= 3 and _same_numbers(two, one, SAME_LOSS_RTOL), f"one process {one}, two workers {two}"


@pytest.mark.parametrize("name", PATTERNS)
def test_keras_prints_once(corpus, name):
    said = {phrase for line in corpus["one_lines"].get((0, name), []) for phrase in KERAS_PRINTS if phrase in line}
    rank0 = {phrase for line in corpus["two_lines"].get((0, name), []) for phrase in KERAS_PRINTS if phrase in line}
    assert rank0 == said, f"{name}: one process printed {sorted(said)}, rank 0 {sorted(rank0)}"


def _ranked(output: str) -> list[tuple[int, str]]:
    pattern = RANK_PREFIX["horovodrun"]
    return [(int(m.group(1)), line[m.end():]) for line in output.splitlines() if (m := pattern.match(line))]


def test_rank1_says_none_of_keras_own_output_and_rank0_all_of_it(corpus):
    lines = _ranked(corpus["jobs"]["two"].output)
    rank1 = [line for rank, line in lines if rank == 1 and any(p in line for p in KERAS_PRINTS + KERAS_WARNS)]
    assert rank1 == [], f"rank 1 printed Keras's own output: {rank1[:3]}"
    for phrase in KERAS_WARNS:
        one = sum(phrase in line for line in corpus["jobs"]["one"].output.splitlines())
        rank0 = sum(phrase in line for rank, line in lines if rank == 0)
        assert one >= 1 and rank0 == one, f"{phrase!r}: one process {one} times, rank 0 {rank0}"


def test_the_new_patterns_print_a_summary_and_keras_warns(corpus):
    for name in ("mirrored_strategy_checkpoint", "loss_inside_model", "embedding_lstm", "fit_predict_fit",
                 "tf_numpy_layers", "no_trainable_weights", "early_stopping"):
        assert any("Total params" in line for line in corpus["one_lines"][(0, name)]), name
    warned = corpus["one_lines"][(0, "no_trainable_weights")]
    assert any("does not have any trainable weights" in line for line in warned)
    assert any("Restoring model weights" in line for line in corpus["one_lines"][(0, "early_stopping")])


def test_plot_model_draws_on_rank_zero_only(corpus):
    assert "multi_input_and_output_model.png" in corpus["one"]["multi_io"]["files"]
    assert "multi_input_and_output_model.png" in corpus["two"][0]["multi_io"]["files"]
    assert corpus["two"][1]["multi_io"]["writes"] == []


def test_mirrored_strategy_guide_restores_its_latest_checkpoint_on_every_rank(corpus):
    name = "mirrored_strategy_checkpoint"
    for lines in [corpus["one_lines"][(0, name)]] + [corpus["two_lines"][(r, name)] for r in (0, 1)]:
        assert any(line.startswith("Restoring from ./ckpt/ckpt-4.keras") for line in lines), lines[-5:]
    assert corpus["one"][name]["files"] == [f"ckpt/ckpt-{epoch}.keras" for epoch in (1, 2, 3, 4)]


def test_multi_worker_mirrored_strategy_is_stood_in_for_with_one_warning(corpus):
    said = [rank for rank, line in _ranked(corpus["jobs"]["two"].output) if "hvdkeras stands in for it" in line]
    assert said == [0], said
    assert "stands in" not in corpus["jobs"]["one"].output  # plain Keras: no hvdkeras


def test_exit_codes(corpus):
    for side, job in corpus["jobs"].items():
        if job.returncode != 0:
            job.fail(f"the {side} side exited {job.returncode}")


def test_corpus_folder_holds_only_scripts():
    assert sorted(p.name for p in CORPUS.iterdir() if p.name != "__pycache__") == [f"{n}.py" for n in PATTERNS]
    assert all(Path(CORPUS / f"{n}.py").read_text().startswith('"""') for n in PATTERNS)
