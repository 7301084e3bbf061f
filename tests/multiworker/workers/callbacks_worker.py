"""Callbacks on real workers: broadcast before step 1, exact global metrics, warm-up, rank-0 checkpoints."""

import os

import numpy as np

from common import max_abs_diff, seed_everything, weights_digest, write_result

import hvdkeras as hvd
from hvdkeras.training import rank_zero
import keras

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
OUT = os.environ["HVDKERAS_TEST_OUT"]
B = 8
result = {"rank": RANK}


def model_with_seed(seed):
    seed_everything(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1, activation="sigmoid")])


def global_data(n_batches, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_batches * B * SIZE, 4)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("float32")[:, None]
    return x, y


def my_rows(n):
    g = B * SIZE
    return np.concatenate([np.arange(k * g + RANK * B, k * g + (RANK + 1) * B) for k in range(n // g)])


# 1. Different initial weights on each rank; the callback makes step 1 start from rank 0's weights.
x, y = global_data(6, seed=11)
rows = my_rows(len(x))
model = model_with_seed(100 + RANK)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss="binary_crossentropy")
model.fit(x[rows], y[rows], batch_size=B, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
ref = model_with_seed(100)  # rank 0's initial weights
ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="binary_crossentropy")
ref.fit(x, y, batch_size=B * SIZE, shuffle=False, verbose=0)
result["broadcast_max_abs_diff"] = max_abs_diff(model.get_weights(), ref.get_weights())

# ... and on a second fit, after rank 0 alone loaded other weights from a checkpoint.
ckpt = os.path.join(OUT, "phase1.weights.h5")
if RANK == 0:
    perturbed = model_with_seed(7)
    perturbed.save_weights(ckpt)
    model.load_weights(ckpt)
rank_zero.barrier()
x2, y2 = global_data(3, seed=12)
rows2 = my_rows(len(x2))
model.fit(x2[rows2], y2[rows2], batch_size=B, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
ref.set_weights(model_with_seed(7).get_weights())
ref.fit(x2, y2, batch_size=B * SIZE, shuffle=False, verbose=0)
result["second_fit_max_abs_diff"] = max_abs_diff(model.get_weights(), ref.get_weights())
result["second_fit_digest"] = weights_digest(model.get_weights())

# 2. Exact global metrics with shards of different sizes (lr=0, so fit's metrics evaluate a fixed model).
rng = np.random.default_rng(5)
xa = rng.normal(size=(40 + 36, 4)).astype("float32")
ya = (xa[:, 0] > 0.3).astype("float32")[:, None]
xv = rng.normal(size=(30 + 17, 4)).astype("float32")
yv = (xv[:, 1] > 0).astype("float32")[:, None]
train_part = slice(0, 40) if RANK == 0 else slice(40, 76)  # 5 batches each: 40 vs 36 samples
val_part = slice(0, 30) if RANK == 0 else slice(30, 47)
metrics_model = model_with_seed(3)
metrics = ["accuracy", keras.metrics.Precision(name="precision"), keras.metrics.AUC(name="auc")]
metrics_model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="binary_crossentropy",
                      metrics=metrics)
stopper = keras.callbacks.EarlyStopping(monitor="val_precision", mode="max", patience=0)
history = metrics_model.fit(
    xa[train_part], ya[train_part], validation_data=(xv[val_part], yv[val_part]), batch_size=B, epochs=3,
    shuffle=False, verbose=0,
    # EarlyStopping first: the global values must reach it whatever the order.
    callbacks=[stopper, hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()])
plain = model_with_seed(3)
plain.set_weights(metrics_model.get_weights())
plain.compile(loss="binary_crossentropy",
              metrics=["accuracy", keras.metrics.Precision(name="precision"), keras.metrics.AUC(name="auc")])
union_train = plain.evaluate(xa, ya, batch_size=B, verbose=0, return_dict=True)
union_val = plain.evaluate(xv, yv, batch_size=B, verbose=0, return_dict=True)
result["history"] = {k: [float(v) for v in vals] for k, vals in history.history.items()}
result["union_train"] = {k: float(v) for k, v in union_train.items()}
result["union_val"] = {k: float(v) for k, v in union_val.items()}
result["epochs_run"] = len(history.epoch)
local_eval = metrics_model.evaluate(xv[val_part], yv[val_part], batch_size=B, verbose=0, return_dict=True,
                                    callbacks=[hvd.callbacks.MetricAverageCallback()])
result["evaluate_global"] = {k: float(v) for k, v in local_eval.items()}


# 3. Warm-up: lr after the first batch is initial_lr / size; initial_lr at the end of warm-up.
class LrRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.first = None
        self.epoch_end = []

    def on_train_batch_end(self, batch, logs=None):
        if self.first is None:
            self.first = float(self.model.optimizer.learning_rate.numpy())

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_end.append(float(self.model.optimizer.learning_rate.numpy()))


recorder = LrRecorder()
warm_model = model_with_seed(4)
warm_model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
                   loss="binary_crossentropy")
warm_model.fit(x[rows], y[rows], batch_size=B, epochs=3, shuffle=False, verbose=0,
               callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                          hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2, verbose=1), recorder])
result["warmup_first_lr"] = recorder.first
result["warmup_epoch_end_lrs"] = recorder.epoch_end

# 4. Rank-0 checkpoints: exactly one file per epoch, and the progress bar on rank 0 only.
ckpt_model = model_with_seed(5)
ckpt_model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="binary_crossentropy")
ckpt_dir = os.path.join(OUT, "ckpts")
wrapped_dir = os.path.join(OUT, "wrapped")
ckpt_model.fit(
    x[rows], y[rows], batch_size=B, epochs=3, verbose=1,
    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
               hvd.callbacks.ModelCheckpoint(os.path.join(ckpt_dir, "ckpt-{epoch:02d}.keras")),
               hvd.callbacks.rank_zero_only(
                   keras.callbacks.ModelCheckpoint(os.path.join(wrapped_dir, "ckpt-{epoch:02d}.keras")))])
result["ckpt_digest"] = weights_digest(ckpt_model.get_weights())
write_result(RANK, result)
