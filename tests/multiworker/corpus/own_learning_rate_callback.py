"""A script's own callback that sets model.optimizer.learning_rate at each epoch from its own schedule
(RMSprop on a small regression, as in "Writing your own callbacks")."""

import keras
import numpy as np

LR_SCHEDULE = [(0, 0.05), (8, 0.02), (16, 0.01), (24, 0.005)]


def lr_schedule(epoch, lr):
    for start, rate in LR_SCHEDULE:
        if epoch == start:
            return rate
    return lr


class CustomLearningRateScheduler(keras.callbacks.Callback):
    def __init__(self, schedule):
        super().__init__()
        self.schedule = schedule

    def on_epoch_begin(self, epoch, logs=None):
        lr = float(np.array(self.model.optimizer.learning_rate))
        scheduled_lr = self.schedule(epoch, lr)
        self.model.optimizer.learning_rate = scheduled_lr
        print(f"\nEpoch {epoch}: learning rate is {scheduled_lr:6.4f}.")


keras.utils.set_random_seed(18)
rng = np.random.default_rng(17)
x = rng.random((1024, 8)).astype("float32") * 10
y = (x @ rng.random((8, 1)) * 3 + rng.standard_normal((1024, 1))).astype("float32")

model = keras.Sequential([keras.Input(shape=(8,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.RMSprop(learning_rate=0.1), loss="mean_squared_error",
              metrics=["mean_absolute_error"])
history = model.fit(x, y, batch_size=64, epochs=30, callbacks=[CustomLearningRateScheduler(lr_schedule)], verbose=2)
