"""Two inputs and two outputs, passed as dicts, with a loss and a loss weight per output ("Models with
multiple inputs and outputs" in the functional API guide, which draws the model with plot_model)."""

import keras
import numpy as np
from keras import layers

keras.utils.set_random_seed(9)
rng = np.random.default_rng(8)
n = 1024
title = rng.random((n, 10)).astype("float32")
body = rng.random((n, 20)).astype("float32")
priority = (title.sum(axis=1, keepdims=True) / 10).astype("float32")
department = (body[:, :4].argmax(axis=1)).astype("int64")

title_input = keras.Input(shape=(10,), name="title")
body_input = keras.Input(shape=(20,), name="body")
features = layers.concatenate([layers.Dense(16, activation="relu")(title_input),
                               layers.Dense(16, activation="relu")(body_input)])
priority_pred = layers.Dense(1, name="priority")(features)
department_pred = layers.Dense(4, name="department")(features)
model = keras.Model(inputs={"title": title_input, "body": body_input},
                    outputs={"priority": priority_pred, "department": department_pred})
keras.utils.plot_model(model, "multi_input_and_output_model.png", show_shapes=True)
model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss={"priority": keras.losses.MeanSquaredError(),
          "department": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
    loss_weights={"priority": 1.0, "department": 0.2},
    metrics={"department": ["accuracy"]},
)
history = model.fit({"title": title, "body": body}, {"priority": priority, "department": department},
                    epochs=8, batch_size=32, verbose=2)
