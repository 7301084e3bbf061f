"""A Spark driver for the Spark tests: one SparkSession, several scenarios, one JSON of what happened.

    python spark_driver.py MASTER OUT SCENARIO [SCENARIO ...]

Scenarios:
- train: hvdkeras.spark.run of a function that runs workers/init_script.py (hvdkeras.init(), the digits, a
  rank-0 checkpoint), 2 processes; the ranks' output is written to this process's stdout.
- failing: rank 1's function raises after init: the driver must get that error, within the stall bound.
- too_many: 3 processes on 2 task slots, start_timeout=5: a clear error within the bound.
- horovod_spark: horovod.spark.run itself with a function that calls hvdkeras.init() and all-reduces.
"""

import json
import os
import sys
import time
import traceback

from pyspark.sql import SparkSession

import hvdkeras.spark

MASTER, OUT = sys.argv[1], sys.argv[2]
INIT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "init_script.py")
spark = (SparkSession.builder.master(MASTER).appName("hvdkeras-tests")
         .config("spark.python.worker.reuse", "true").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
results = {}


def train(report_dir, model_dir):
    import runpy

    rank = os.environ["RANK"]
    sys.argv = [INIT_SCRIPT, "--report-dir", report_dir, "--out-dir", os.path.join(model_dir, rank)]
    runpy.run_path(INIT_SCRIPT, run_name="__main__")
    import hvdkeras

    return {"rank": hvdkeras.rank(), "size": hvdkeras.size(), "pid": os.getpid()}


def failing():
    import hvdkeras

    hvdkeras.init()
    if hvdkeras.rank() == 1:
        raise ValueError("rank 1 cannot go on")
    import tensorflow as tf

    return float(hvdkeras.allreduce(tf.constant(1.0)))  # waits for rank 1, which is gone


def allreduce_rank():
    import tensorflow as tf

    import hvdkeras

    hvdkeras.init()
    return {"rank": hvdkeras.rank(), "size": hvdkeras.size(),
            "sum": float(hvdkeras.allreduce(tf.constant(float(hvdkeras.rank())), op=hvdkeras.Sum))}


for scenario in sys.argv[3:]:
    start = time.monotonic()
    try:
        if scenario == "train":
            value = hvdkeras.spark.run(train, args=(os.path.join(OUT, "report"), os.path.join(OUT, "model")),
                                       num_proc=2, stdout=sys.stdout, stderr=sys.stdout)
        elif scenario == "failing":
            value = hvdkeras.spark.run(failing, num_proc=2, env={"HVDKERAS_STALL_TIMEOUT": "15"})
        elif scenario == "too_many":
            value = hvdkeras.spark.run(allreduce_rank, num_proc=3, start_timeout=5)
        elif scenario == "horovod_spark":
            import horovod.spark

            value = horovod.spark.run(allreduce_rank, num_proc=2, use_gloo=True, verbose=0)
        results[scenario] = {"value": value, "error": None}
    except Exception as err:  # noqa: BLE001 - what each scenario raised is what the tests check
        results[scenario] = {"value": None, "error": f"{type(err).__name__}: {err}",
                             "traceback": traceback.format_exc()}
    results[scenario]["seconds"] = time.monotonic() - start
    sys.stdout.flush()

with open(os.path.join(OUT, "spark.json"), "w") as f:
    json.dump(results, f, indent=1)
spark.stop()
