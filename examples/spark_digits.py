"""Training on Spark: hvdkeras.spark.run starts the training function in the tasks of one barrier stage.

Locally:              python examples/spark_digits.py                           (a local[2] Spark)
On a cluster:         python examples/spark_digits.py --master spark://HOST:7077 --num-proc 4
                      (with `pip install hvdkeras[spark]` on every node)

The function builds the model, shards the bundled digits with hvdkeras.data.shard, trains with a
DistributedOptimizer and returns each rank's validation accuracy; run returns them ordered by rank.
"""

import argparse
import os
import sys

from pyspark.sql import SparkSession

import hvdkeras.spark

EXAMPLES = os.path.dirname(os.path.abspath(__file__))


def train(epochs: int, out_dir: str) -> dict:
    sys.path.insert(0, EXAMPLES)
    import keras
    import tensorflow as tf
    from _digits import cnn, load

    import hvdkeras as hvd

    hvd.init()
    (x, y), (vx, vy) = load()
    data = hvd.data.shard(tf.data.Dataset.from_tensor_slices((x, y)), seed=0).batch(32)
    model = cnn()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_learning_rate(1e-3))),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(data, epochs=epochs, validation_data=(vx, vy), verbose=2 if hvd.rank() == 0 else 0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback(),
                                   hvd.callbacks.ModelCheckpoint(os.path.join(out_dir, "spark-digits.keras"))])
    return {"rank": hvd.rank(), "size": hvd.size(), "val_accuracy": history.history["val_accuracy"][-1]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out-dir", default="digits_out")
    args = parser.parse_args()
    spark = (SparkSession.builder.master(args.master).appName("hvdkeras-spark-digits")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    os.makedirs(args.out_dir, exist_ok=True)
    results = hvdkeras.spark.run(train, args=(args.epochs, os.path.abspath(args.out_dir)), num_proc=args.num_proc,
                                 stdout=sys.stdout, stderr=sys.stderr)
    for r in results:
        print(f"rank {r['rank']} of {r['size']}: val_accuracy {r['val_accuracy']:.4f}")
    spark.stop()
