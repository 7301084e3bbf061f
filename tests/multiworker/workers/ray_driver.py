"""A Ray Train driver for the Ray tests: connects to the test's cluster, runs scenarios, one JSON of results.

    python ray_driver.py ADDRESS OUT SCENARIO [SCENARIO ...]

Every scenario is Ray's own TensorflowTrainer with a loop that calls hvdkeras.init() and model.fit.

- train: workers/init_script.py in the loop, 2 workers (the launcher tests' checks). Each rank writes its
  pid to OUT/train/pids/rank<r>, so the test can tell which rank printed which line.
- restart: FailureConfig(max_failures=1); 2 workers, 4 epochs, hvdkeras.ray.ReportCheckpointCallback. Rank 1
  SIGKILLs itself in the middle of epoch 3 of the first attempt; Ray restarts both, and they resume from
  the checkpoint of epoch 2.
- elastic: ScalingConfig(num_workers=(1, 2)), FailureConfig(max_failures=3), 8 epochs; the test takes the
  second host's node away and brings it back. While OUT/elastic/hold exists, workers wait at each epoch end
  (so a one-worker attempt cannot finish before the node is back).

Each attempt's workers write OUT/<scenario>/attempts/<pid>.json when fit begins (after any resume) and
again after every epoch: size, rank, the epoch fit started at, epochs done, steps, a digest of the weights.
"""

import json
import os
import sys
import time
import traceback

import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer

ADDRESS, OUT = sys.argv[1], sys.argv[2]
WORKERS = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(WORKERS, "..", "..", "..", "examples")


def train_init_script(config):
    """workers/init_script.py, as the launcher tests run it."""
    import runpy

    sys.path[:0] = [config["workers"], config["examples"]]
    rank = ray.train.get_context().get_world_rank()
    os.makedirs(os.path.join(config["out"], "pids"), exist_ok=True)
    with open(os.path.join(config["out"], "pids", f"rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
    script = os.path.join(config["workers"], "init_script.py")
    sys.argv = [script, "--report-dir", os.path.join(config["out"], "report"),
                "--out-dir", os.path.join(config["out"], "model", str(rank))]
    runpy.run_path(script, run_name="__main__")


def train_resumable(config):
    """The digits with hvdkeras.ray.ReportCheckpointCallback; writes what each attempt did."""
    sys.path[:0] = [config["workers"], config["examples"]]
    import keras
    import tensorflow as tf
    from _digits import cnn, load
    from common import weights_digest

    import hvdkeras as hvd
    import hvdkeras.ray

    hvd.init()
    (x, y), _ = load()
    shard = hvd.data.shard(tf.data.Dataset.from_tensor_slices((x, y))).batch(32)
    model = cnn(seed=1 + hvd.rank())
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_learning_rate(1e-3))),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    attempts = os.path.join(config["out"], "attempts")
    os.makedirs(attempts, exist_ok=True)
    reporter = hvdkeras.ray.ReportCheckpointCallback()

    class Record(keras.callbacks.Callback):
        """After the reporter: at train begin, the model as resumed; after each epoch, what was done."""

        def on_train_begin(self, logs=None):
            self.state = {"pid": os.getpid(), "rank": hvd.rank(), "size": hvd.size(), "began": time.time(),
                          "initial_epoch": model._initial_epoch or 0, "resumed": reporter.restored_from is not None,
                          "resumed_digest": weights_digest(model.get_weights()), "epochs_done": [], "digests": {},
                          "steps": 0, "iterations": int(model.optimizer.iterations), "first_batch": None,
                          "learning_rate": float(model.optimizer.learning_rate)}
            self._write()

        def on_train_batch_end(self, batch, logs=None):
            self.state["steps"] += 1
            if self.state["first_batch"] is None:
                self.state["first_batch"] = time.time()
            epoch, batches = self.state.get("epoch"), self.params["steps"]
            kill = config.get("kill")
            if (kill and hvd.rank() == kill["rank"] and epoch == kill["epoch"] and batch == batches // 2
                    and not os.path.exists(kill["marker"])):
                _wait_until_registered(kill["snapshot"], kill["epoch"])
                with open(kill["marker"], "w") as f:
                    json.dump({"killed": time.time(), "epoch": epoch, "batch": batch, "pid": os.getpid()}, f)
                os.kill(os.getpid(), 9)

        def on_epoch_begin(self, epoch, logs=None):
            self.state["epoch"] = epoch

        def on_epoch_end(self, epoch, logs=None):
            self.state["epochs_done"].append(epoch)
            self.state["digests"][str(epoch)] = weights_digest(model.get_weights())
            self.state["loss"] = float(logs["loss"])
            self._write()
            while config.get("hold") and os.path.exists(config["hold"]):
                time.sleep(0.2)

        def _write(self):
            path = os.path.join(attempts, f"{os.getpid()}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(self.state, f)
            os.replace(path + ".tmp", path)

    model.fit(shard, epochs=config["epochs"], verbose=2 if hvd.rank() == 0 else 0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                         reporter, Record()])


def _wait_until_registered(snapshot, count, timeout=30):
    """Until Ray's controller has registered `count` checkpoints: a report reaches it at its next poll of the
    workers (every 2 s), and a failure before that poll resumes from the one before."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(snapshot) as f:
                if len(json.load(f)["checkpoint_results"]) >= count:
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"Ray registered fewer than {count} checkpoints in {timeout} s ({snapshot})")


def trainer(name, loop, scaling, failures=0, **config):
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    config = {"out": out, "workers": WORKERS, "examples": EXAMPLES, **config}
    return TensorflowTrainer(loop, train_loop_config=config, scaling_config=scaling,
                             run_config=RunConfig(name=name, storage_path=os.path.join(OUT, "storage"),
                                                  failure_config=FailureConfig(max_failures=failures)))


def describe(result):
    checkpoint = result.checkpoint
    files = None
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            files = sorted(os.listdir(folder))
            with open(os.path.join(folder, "hvdkeras.json")) as f:
                state = json.load(f)
    return {"error": None if result.error is None else f"{type(result.error).__name__}: {result.error}",
            "metrics": result.metrics, "checkpoint_files": files,
            "checkpoint_state": state if checkpoint is not None else None}


ray.init(address=ADDRESS, log_to_driver=True)
deadline = time.monotonic() + 90
while sum(node["Alive"] for node in ray.nodes()) < 2:  # the second host's node may still be joining
    if time.monotonic() > deadline:
        raise SystemExit(f"the Ray cluster has not 2 alive nodes after 90 s: {ray.nodes()}")
    time.sleep(0.5)
results = {}
for scenario in sys.argv[3:]:
    start = time.monotonic()
    try:
        if scenario == "train":
            job = trainer("train", train_init_script, ScalingConfig(num_workers=2))
        elif scenario == "restart":
            kill = {"rank": 1, "epoch": 2, "marker": os.path.join(OUT, "restart", "killed.json"),
                    "snapshot": os.path.join(OUT, "storage", "restart", "checkpoint_manager_snapshot.json")}
            job = trainer("restart", train_resumable, ScalingConfig(num_workers=2), failures=1, epochs=4, kill=kill)
        elif scenario == "elastic":
            job = trainer("elastic", train_resumable,
                          ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=3.0),
                          failures=3, epochs=8, hold=os.path.join(OUT, "elastic", "hold"))
        else:
            raise ValueError(f"no scenario {scenario!r}")
        results[scenario] = describe(job.fit())
    except Exception as err:  # noqa: BLE001 - what each scenario raised is what the tests check
        results[scenario] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    results[scenario]["seconds"] = time.monotonic() - start
    print(f"ray_driver: {scenario} took {results[scenario]['seconds']:.1f} s", flush=True)
with open(os.path.join(OUT, "ray.json"), "w") as f:
    json.dump(results, f, indent=1, default=str)
