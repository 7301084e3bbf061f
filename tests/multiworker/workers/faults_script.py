"""A plain Keras training script with injected faults, run by `hvdkeras run -np 2` in the fault tests.

    faults_script.py MODE OUT_DIR [options]

MODE: raise | kill | stop | exit3 | segv | hang (rank 1 fails in epoch 2) | mismatch-units | mismatch-layer |
      resume | atomic
The fault is injected from HOROVOD_RANK, which horovodrun sets; the script never imports hvdkeras.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

import numpy as np

import keras
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("mode")
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--kill-after-epoch", type=int, default=None)
args = parser.parse_args()
RANK = int(os.environ.get("HOROVOD_RANK", "0"))

keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 6)).astype("float32")
y = (x[:, :3] * 2 - x[:, 3:]).astype("float32")

units = 9 if args.mode == "mismatch-units" and RANK == 1 else 8
layers = [keras.Input((6,)), keras.layers.Dense(units, activation="tanh")]
if args.mode == "mismatch-layer" and RANK == 1:
    layers.append(keras.layers.Dense(8, activation="tanh"))
if args.mode == "atomic":
    layers.append(keras.layers.Dense(3000, activation="tanh"))  # big enough that a save takes a while
    layers.append(keras.layers.Dense(3000))
layers.append(keras.layers.Dense(3))
model = keras.Sequential(layers)
model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")


def mark(name):
    with open(os.path.join(args.out, f"{name}.rank{RANK}"), "w") as f:
        f.write(repr(time.time()))


mark("model")  # built: from here a mismatch must be found before any stall timeout


class Fault(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if RANK != 1 or self.epoch != 1 or batch != 3:
            return
        mark("fault")
        if args.mode == "raise":
            raise RuntimeError("injected failure on rank 1")
        if args.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if args.mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if args.mode == "exit3":
            sys.exit(3)
        if args.mode == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if args.mode == "hang":
            time.sleep(3600)  # stops submitting collectives, alive: the others time out at the stall bound


class KillJob(keras.callbacks.Callback):
    """Kills rank 0 (and so the job) right after the backup of epoch `kill_after_epoch` was written."""

    def on_epoch_end(self, epoch, logs=None):
        if RANK == 0 and epoch + 1 == args.kill_after_epoch:
            mark("killed")
            os.kill(os.getpid(), signal.SIGKILL)


class KillDuringSave(keras.callbacks.Callback):
    """On rank 0, SIGKILLs the process while the second epoch's checkpoint is being written.

    A watcher kills as soon as the temporary file has bytes in it; should the write outrun the watcher,
    the rename that would publish the file kills instead. Either way the kill lands inside the save,
    whatever the machine's speed.
    """

    def on_epoch_end(self, epoch, logs=None):
        if RANK != 0 or epoch != 1:
            return
        directory = args.out
        publish = os.replace

        def kill():
            os.kill(os.getpid(), signal.SIGKILL)

        def watch():
            while True:
                for name in os.listdir(directory):
                    if name.startswith(".ckpt-02.") and os.path.getsize(os.path.join(directory, name)) > 0:
                        kill()
                time.sleep(0.001)

        def replace(src, dst, *a, **kw):
            if os.path.basename(str(dst)) == "ckpt-02.keras":
                kill()
            return publish(src, dst, *a, **kw)

        os.replace = replace
        threading.Thread(target=watch, daemon=True).start()


callbacks = [Fault()]
if args.mode == "resume":
    callbacks = [keras.callbacks.BackupAndRestore(os.path.join(args.out, "backup")), KillJob()]
if args.mode == "atomic":
    callbacks = [KillDuringSave(),
                 keras.callbacks.ModelCheckpoint(os.path.join(args.out, "ckpt-{epoch:02d}.keras"))]
model.fit(x, y, batch_size=16, epochs=args.epochs, shuffle=False, verbose=0, callbacks=callbacks)
np.savez(os.path.join(args.out, f"weights.rank{RANK}.npz"), *model.get_weights())
with open(os.path.join(args.out, f"done.rank{RANK}"), "w") as f:
    json.dump({"epochs": args.epochs}, f)
