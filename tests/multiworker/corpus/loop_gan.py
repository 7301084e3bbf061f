"""A GAN trained in a loop of its own: two models, two optimizers, a tf.function step that updates the
discriminator and then the generator, its losses kept in Keras metrics (the structure of Keras's GAN guide,
written as a loop: the batch size read from the batch, the latent vectors drawn for it)."""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

keras.utils.set_random_seed(5)
latent_dim = 8
rng = np.random.default_rng(2)
real = rng.random((256, 32)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices(real).batch(32)

discriminator = keras.Sequential([keras.Input((32,)), layers.Dense(16), layers.LeakyReLU(0.2), layers.Dense(1)])
generator = keras.Sequential([keras.Input((latent_dim,)), layers.Dense(16), layers.LeakyReLU(0.2),
                              layers.Dense(32, activation="sigmoid")])
d_optimizer = keras.optimizers.Adam(1e-3)
g_optimizer = keras.optimizers.Adam(1e-3)
loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
d_tracker, g_tracker = keras.metrics.Mean(), keras.metrics.Mean()
seed = keras.random.SeedGenerator(1337)


@tf.function
def train_step(real_images):
    batch_size = tf.shape(real_images)[0]
    z = keras.random.normal((batch_size, latent_dim), seed=seed)
    combined = tf.concat([generator(z), real_images], axis=0)
    labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
    with tf.GradientTape() as tape:
        d_loss = loss_fn(labels, discriminator(combined))
    grads = tape.gradient(d_loss, discriminator.trainable_weights)
    d_optimizer.apply_gradients(zip(grads, discriminator.trainable_weights))
    z = keras.random.normal((batch_size, latent_dim), seed=seed)
    with tf.GradientTape() as tape:
        g_loss = loss_fn(tf.zeros((batch_size, 1)), discriminator(generator(z)))
    grads = tape.gradient(g_loss, generator.trainable_weights)
    g_optimizer.apply_gradients(zip(grads, generator.trainable_weights))
    d_tracker.update_state(d_loss)
    g_tracker.update_state(g_loss)


model = generator
history = {"loss": []}
for epoch in range(3):
    for batch in dataset:
        train_step(batch)
    history["loss"].append(float(g_tracker.result()))
    print(f"loop: epoch {epoch} d_loss {float(d_tracker.result()):.6f} g_loss {float(g_tracker.result()):.6f}")
    d_tracker.reset_state()
    g_tracker.reset_state()
