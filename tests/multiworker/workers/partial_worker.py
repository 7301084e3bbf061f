"""Process sets and local variables on real workers.

Process sets: {0} and {1} registered at init; collectives and a DistributedOptimizer scoped to one of
them stay within it, global ones span both. Local variables: a head layer kept per worker
(PartialDistributedOptimizer + BroadcastGlobalVariablesCallback(local_variables=...)) while the shared
layers stay identical.
"""

import common
import numpy as np
from common import max_abs_diff, seed_everything, weights_digest, write_result

import hvdkeras as hvd
import keras

# scenarios.py registers these two sets when it starts Horovod for several scenarios at once.
alone = common.PROCESS_SETS or [hvd.ProcessSet([0]), hvd.ProcessSet([1])]
if not hvd.is_initialized():
    hvd.init(process_sets=alone)
RANK = hvd.rank()
mine = alone[RANK]
result = {"rank": RANK, "process_set_ranks": mine.ranks, "process_set_size": mine.size()}
result["allreduce_own_set"] = float(hvd.allreduce(float(RANK + 1), process_set=mine))
result["allreduce_global"] = float(hvd.allreduce(float(RANK + 1)))
result["allgather_own_set"] = hvd.allgather([RANK], process_set=mine).numpy().tolist()

rng = np.random.default_rng(RANK)
x = rng.normal(size=(32, 3)).astype("float32")
y = rng.normal(size=(32, 1)).astype("float32")


def model(seed):
    seed_everything(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])


# A DistributedOptimizer on the rank's own process set trains like one process on its own data.
scoped = model(1)
scoped.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=mine), loss="mse")
scoped.fit(x, y, batch_size=8, shuffle=False, verbose=0)
alone_ref = model(1)
alone_ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
alone_ref.fit(x, y, batch_size=8, shuffle=False, verbose=0)
result["scoped_vs_alone"] = max_abs_diff(scoped.get_weights(), alone_ref.get_weights())
result["scoped_digest"] = weights_digest(scoped.get_weights())

# Local head: each rank starts from its own seed; only the shared layer is broadcast and averaged.
net = model(10 + RANK)
head = net.layers[-1]
head_before = [w.copy() for w in head.get_weights()]
net.compile(optimizer=hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[head]), loss="mse")


class Probe(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:
            result["head_kept_by_broadcast"] = max_abs_diff(head.get_weights(), head_before)
            result["shared_after_broadcast"] = weights_digest(net.layers[0].get_weights())


net.fit(x, y, batch_size=8, shuffle=False, verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=head.trainable_weights),
                   Probe()])
result["shared_digest"] = weights_digest(net.layers[0].get_weights())
result["head_digest"] = weights_digest(head.get_weights())
write_result(RANK, result)
