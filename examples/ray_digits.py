"""Training on Ray Train: Ray's own TensorflowTrainer, with a loop that calls hvdkeras.init() and model.fit.

Locally:              python examples/ray_digits.py                         (starts a local Ray, 2 workers)
On a cluster:         python examples/ray_digits.py --address HEAD:6379 --num-workers 1 4 --storage-path /shared
                      (with `pip install hvdkeras[ray]` on every node; two numbers are an elastic
                      ScalingConfig(num_workers=(min, max)))

TensorflowTrainer gives each worker a TF_CONFIG, from which hvdkeras.init() forms one job. The loop shards
the bundled digits, trains with a DistributedOptimizer and reports rank 0's checkpoint after every epoch
through hvdkeras.ray.ReportCheckpointCallback. When Ray restarts the workers (a failure, or a resize), the
new fit resumes from the last checkpoint. The result's checkpoint holds model.keras.
"""

import argparse
import os
import sys

import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer

EXAMPLES = os.path.dirname(os.path.abspath(__file__))


def train_loop(config: dict) -> None:
    sys.path.insert(0, EXAMPLES)
    import keras
    import tensorflow as tf
    from _digits import cnn, load

    import hvdkeras as hvd
    import hvdkeras.ray

    hvd.init()
    (x, y), (vx, vy) = load()
    data = hvd.data.shard(tf.data.Dataset.from_tensor_slices((x, y)), seed=0).batch(32)
    model = cnn()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_learning_rate(1e-3))),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(data, epochs=config["epochs"], validation_data=(vx, vy), verbose=2 if hvd.rank() == 0 else 0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                         hvdkeras.ray.ReportCheckpointCallback()])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="a Ray cluster's address (default: start a local Ray)")
    parser.add_argument("--num-workers", type=int, nargs="+", default=[2], help="N, or MIN MAX for elastic")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-failures", type=int, default=1)
    parser.add_argument("--storage-path", default=os.path.abspath("digits_out"))
    args = parser.parse_args()
    if len(args.num_workers) > 2:
        parser.error(f"--num-workers takes N or MIN MAX. Received: {args.num_workers}")
    ray.init(address=args.address)
    workers = args.num_workers[0] if len(args.num_workers) == 1 else tuple(args.num_workers)
    result = TensorflowTrainer(
        train_loop, train_loop_config={"epochs": args.epochs}, scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(storage_path=os.path.abspath(args.storage_path),
                             failure_config=FailureConfig(max_failures=args.max_failures))).fit()
    if result.error is not None:
        raise SystemExit(f"training failed: {result.error}")
    print(f"val_accuracy {result.metrics['val_accuracy']:.4f}; checkpoint {result.checkpoint.path}")
