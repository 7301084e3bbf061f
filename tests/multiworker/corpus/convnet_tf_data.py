"""A small convnet with BatchNormalization and Dropout on a shuffled, batched tf.data pipeline, with a
validation dataset ("Simple MNIST convnet" in the keras.io style)."""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

keras.utils.set_random_seed(21)
rng = np.random.default_rng(20)
images = rng.random((1024, 8, 8, 1)).astype("float32")
labels = (images[:, :4, :4, 0].mean(axis=(1, 2)) > 0.5).astype("int64") + (images[:, 4:, 4:, 0].mean(axis=(1, 2)) > 0.5)
train = tf.data.Dataset.from_tensor_slices((images[:768], labels[:768])).shuffle(768, seed=2).batch(32)
val = tf.data.Dataset.from_tensor_slices((images[768:], labels[768:])).batch(64)

model = keras.Sequential([
    keras.Input(shape=(8, 8, 1)),
    layers.Conv2D(8, 3, activation="relu", padding="same"),
    layers.BatchNormalization(),
    layers.MaxPooling2D(),
    layers.Flatten(),
    layers.Dropout(0.2),
    layers.Dense(3, activation="softmax"),
])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(train, epochs=8, validation_data=val, verbose=2)
