"""Plain Keras 3 training on the handwritten digits bundled beside it (examples/digits.csv.gz): no hvdkeras in sight.

Single process:       python examples/plain_keras_digits.py
Data-parallel:        hvdkeras run -np 2 examples/plain_keras_digits.py
(`hvdkeras run` splits each batch of 32 over the workers, as Keras's own distribution does, shards the
validation split, wraps the optimizer, adds the broadcast and exact-metric callbacks, and makes the
checkpoints and the final save rank-0 only.)
"""

import argparse
import os

import keras
import numpy as np
from _digits import cnn, load_digits

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--out-dir", default="digits_out")
args = parser.parse_args()

x, y = load_digits()
x = (x / 16.0).reshape(-1, 8, 8, 1).astype("float32")
order = np.random.default_rng(0).permutation(len(x))  # the validation split takes the last 20%
x, y = x[order], y[order].astype("int64")

model = cnn()  # the small CNN of examples/_digits.py, plain Keras
model.compile(optimizer=keras.optimizers.Adam(args.lr), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
os.makedirs(args.out_dir, exist_ok=True)
history = model.fit(
    x, y, batch_size=args.batch_size, epochs=args.epochs, validation_split=0.2, verbose=2,
    callbacks=[keras.callbacks.ModelCheckpoint(os.path.join(args.out_dir, "ckpt-{epoch:02d}.keras"))],
)
model.save(os.path.join(args.out_dir, "digits.keras"))
print(f"final val_accuracy {history.history['val_accuracy'][-1]:.4f}, model saved to "
      f"{os.path.join(args.out_dir, 'digits.keras')}")
