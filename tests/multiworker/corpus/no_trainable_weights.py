"""A model with no trainable weights: a frozen feature layer and a Normalization layer adapted to the data,
fitted (Keras warns that nothing trains) and evaluated."""

import keras
import numpy as np

keras.utils.set_random_seed(31)
rng = np.random.default_rng(30)
x = rng.random((512, 6)).astype("float32")
y = x.sum(axis=1, keepdims=True).astype("float32")

normalization = keras.layers.Normalization()
normalization.adapt(x)
frozen = keras.layers.Dense(1, trainable=False)
model = keras.Sequential([keras.Input(shape=(6,)), normalization, frozen])
model.compile(optimizer="adam", loss="mse")
model.summary()
history = model.fit(x, y, batch_size=32, epochs=2, verbose=2)
print(f"evaluation loss: {model.evaluate(x, y, verbose=0):.4f}")
