"""A plain Keras training script whose rank 0 is SIGKILLed while a checkpoint is being written; run by
`hvdkeras run -np 2` from benchmarks/kill_trials.py.

    kill_worker.py WRITER OUT_DIR [--epochs 4] [--kill-epoch K --kill-fraction F]

WRITER: checkpoint (ModelCheckpoint, one file per epoch) | backup (BackupAndRestore) | save (model.save to one
path every epoch). With --kill-epoch, rank 0 kills itself F x (the previous epoch's write time) after the
epoch-K write began, so the kill lands inside the write for F < 1. The script never imports hvdkeras.
"""

import argparse
import os
import signal
import threading
import time

import keras
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("writer", choices=["checkpoint", "backup", "save"])
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--kill-epoch", type=int, default=None)
parser.add_argument("--kill-fraction", type=float, default=0.5)
args = parser.parse_args()
RANK = int(os.environ.get("HOROVOD_RANK", "0"))

keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 16)).astype("float32")
y = (x[:, :4] * 2 - x[:, 4:8]).astype("float32")
# Big enough that a save takes a while (about 40 MB of weights and Adam state).
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(1500, activation="tanh"),
                          keras.layers.Dense(1500, activation="tanh"), keras.layers.Dense(4)])
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")


class WriteBegins(keras.callbacks.Callback):
    """Placed before the writer: notes when each epoch's write begins and, at the kill epoch, arms the kill."""

    def __init__(self, timing):
        super().__init__()
        self.timing = timing

    def on_epoch_end(self, epoch, logs=None):
        self.timing["begin"] = time.monotonic()
        if RANK == 0 and epoch == args.kill_epoch:
            delay = args.kill_fraction * self.timing.get("last", 0.05)
            with open(os.path.join(args.out, "kill.json"), "w") as f:
                f.write(f'{{"epoch": {epoch}, "delay": {delay}, "write_seconds": {self.timing.get("last", 0.0)}}}')
            threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()


class WriteEnds(keras.callbacks.Callback):
    """Placed after the writer: the write's duration, for the next epoch's kill."""

    def __init__(self, timing):
        super().__init__()
        self.timing = timing

    def on_epoch_end(self, epoch, logs=None):
        self.timing["last"] = time.monotonic() - self.timing["begin"]


class SaveEveryEpoch(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        self.model.save(os.path.join(args.out, "model.keras"))


timing: dict = {}
writer = {"checkpoint": lambda: keras.callbacks.ModelCheckpoint(os.path.join(args.out, "ckpt-{epoch:02d}.keras")),
          "backup": lambda: keras.callbacks.BackupAndRestore(os.path.join(args.out, "backup")),
          "save": SaveEveryEpoch}[args.writer]()
model.fit(x, y, batch_size=32, epochs=args.epochs, shuffle=False, verbose=0,
          callbacks=[WriteBegins(timing), writer, WriteEnds(timing)])
np.savez(os.path.join(args.out, f"weights.rank{RANK}.npz"), *model.get_weights())
