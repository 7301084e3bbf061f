"""Synchronized batch normalization on real workers, against one process on the global batch.

Equal batches: 2 workers x 8 rows train like plain BatchNormalization on the 16-row global batch
(weights, moving mean and variance), for hvdkeras.SyncBatchNormalization and for Keras's own
BatchNormalization(synchronized=True). Uneven batches (6 and 10 rows): the normalized outputs and the
moving statistics equal those of plain BatchNormalization on the 16 rows together.
"""

import numpy as np
from common import max_abs_diff, seed_everything, write_result

import hvdkeras as hvd
import keras

hvd.init()
RANK = hvd.rank()
B = 8
rng = np.random.default_rng(0)
x = rng.normal(loc=1.0, scale=2.0, size=(5 * 2 * B, 4)).astype("float32")
y = rng.normal(size=(5 * 2 * B, 1)).astype("float32")
rows = np.concatenate([np.arange(k * 2 * B + RANK * B, k * 2 * B + (RANK + 1) * B) for k in range(5)])
result = {"rank": RANK}


def net(norm):
    seed_everything(3)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), norm, keras.layers.Dense(1)])


reference = net(keras.layers.BatchNormalization())
reference.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
reference.fit(x, y, batch_size=2 * B, shuffle=False, verbose=0)

for kind, layer in (("sync_layer", hvd.SyncBatchNormalization()),
                    ("keras_synchronized", keras.layers.BatchNormalization(synchronized=True))):
    model = net(layer)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    model.fit(x[rows], y[rows], batch_size=B, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    result[f"{kind}_max_abs_diff"] = max_abs_diff(model.get_weights(), reference.get_weights())
    result[f"{kind}_moving_diff"] = max_abs_diff(layer.get_weights()[2:], reference.layers[1].get_weights()[2:])

# Uneven per-worker batches: 6 rows on rank 0, 10 on rank 1.
both = rng.normal(loc=-2.0, scale=3.0, size=(16, 4)).astype("float32")
mine = both[:6] if RANK == 0 else both[6:]
sync = hvd.SyncBatchNormalization(momentum=0.5)
plain = keras.layers.BatchNormalization(momentum=0.5)
out_sync = sync(mine, training=True).numpy()
out_plain = plain(both, training=True).numpy()
result["uneven_output_diff"] = float(np.max(np.abs(out_sync - (out_plain[:6] if RANK == 0 else out_plain[6:]))))
result["uneven_moving_diff"] = max_abs_diff(sync.get_weights()[2:], plain.get_weights()[2:])
write_result(RANK, result)
