"""`--reducer` for unmodified scripts on 2 real workers: `hvdkeras run --reducer powersgd:...` and `python -m
hvdkeras --reducer local_sgd:...` under horovodrun, each on a script that calls model.fit and then trains a
second model in a GradientTape loop of its own. Both models train as one on both ranks, through the reducer
asked for (read from the report and from the loop's optimizer)."""

import json
import sys

import pytest

from launch import VENV_BIN, WORKERS, run_jobs

SCRIPT = WORKERS / "reducer_flag_script.py"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    run_out, module_out = tmp_path_factory.mktemp("reducer_run"), tmp_path_factory.mktemp("reducer_module")
    launches = {
        "run": ([str(VENV_BIN / "hvdkeras"), "run", "-np", "2", "--reducer", "powersgd:rank=1,start_step=2",
                 "--report-dir", str(run_out / "report"), str(SCRIPT), str(run_out)], run_out, None),
        "module": ([str(VENV_BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m",
                    "hvdkeras", "--reducer", "local_sgd:period=2", "--report-dir", str(module_out / "report"),
                    str(SCRIPT), str(module_out)], module_out, None),
    }
    done = run_jobs(launches, timeout=300)
    for name, (_, out, _) in launches.items():
        job = done[name]
        if job.returncode != 0:
            job.fail(f"the --reducer launch {name!r} exited with {job.returncode}")
        job.results = {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}
        job.reports = {r: json.loads((out / "report" / f"rank{r}.json").read_text()) for r in (0, 1)}
    return done


@pytest.mark.parametrize("name, reducer", [("run", "PowerSGDReducer(rank=1, start_step=2"),
                                           ("module", "LocalSGDReducer(period=2")])
def test_fit_and_the_scripts_own_loop_train_one_model_through_the_reducer_asked_for(jobs, name, reducer):
    job = jobs[name]
    for rank in (0, 1):
        assert reducer in job.reports[rank]["reducers"]["optimizer"], job.reports[rank]
        assert job.results[rank]["loop_reducer"].startswith(reducer.split("(")[0]), job.results[rank]
        assert job.results[rank]["loop_steps"] == 4 * 2  # 64 rows, batches of 16, two epochs
    for key in ("fit", "loop"):
        assert job.results[0][key] == job.results[1][key], f"{name}: {key} differs between the ranks"
    assert job.reports[0]["weights_sha256"] == job.reports[1]["weights_sha256"]


def test_local_sgd_averages_batch_norm_statistics_of_a_fitted_model(jobs):
    a, b = (jobs["module"].results[r]["fit_stats"] for r in (0, 1))
    assert a == b
