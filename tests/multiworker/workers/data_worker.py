"""fit() on sharded datasets: 97 elements (known cardinality), a filtered one (unknown), TFRecord files."""

import os
import sys


from common import write_result

import hvdkeras as hvd
import keras
import tensorflow as tf

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
OUT = os.environ["HVDKERAS_TEST_OUT"]
EPOCHS = 3
result = {"rank": RANK}


def train(name, dataset):
    seen = []

    def record(ids):
        seen.extend(int(i) for i in ids.numpy().ravel())
        return ids

    ds = dataset.batch(8).map(lambda ids: (tf.py_function(record, [ids], tf.int64), ids))
    ds = ds.map(lambda ids, y: (tf.cast(tf.reshape(ids, (-1, 1)), tf.float32), tf.cast(y, tf.float32)))

    class Steps(keras.callbacks.Callback):
        count = 0

        def on_train_batch_end(self, batch, logs=None):
            Steps.count += 1

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(1e-6)), loss="mse")
    model.fit(ds, epochs=EPOCHS, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Steps()])
    per_epoch = len(seen) // EPOCHS
    result[name] = {"steps": Steps.count, "seen": [seen[e * per_epoch:(e + 1) * per_epoch] for e in range(EPOCHS)]}


train("known", hvd.data.shard(tf.data.Dataset.range(97), seed=1))
train("unknown", hvd.data.shard(tf.data.Dataset.range(97).filter(lambda x: x >= 0)))

files = [os.path.join(OUT, f"part-{i}.tfrecord") for i in range(5)]
if RANK == 0:
    for i, path in enumerate(files):
        with tf.io.TFRecordWriter(path + ".tmp") as w:
            for j in range(10 + i):  # uneven files: 10..14 records
                w.write(str(i * 100 + j).encode())
        os.replace(path + ".tmp", path)
from hvdkeras.training import rank_zero  # noqa: E402

rank_zero.barrier()
records = tf.data.Dataset.list_files(os.path.join(OUT, "part-*.tfrecord"), shuffle=False).interleave(
    tf.data.TFRecordDataset, cycle_length=1)
records = records.map(lambda s: tf.strings.to_number(s, tf.int64))
train("files", hvd.data.shard(records))
write_result(RANK, result)
sys.stdout.flush()
