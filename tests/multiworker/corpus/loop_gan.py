"""A GAN trained in a loop of its own: two models, two optimizers, a tf.function step that updates the
discriminator and then the generator (the structure of Keras's GAN guide, written as a loop)."""

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
noise = tf.constant(rng.standard_normal((8, 32, latent_dim)).astype("float32"))  # fixed, as the script seeds it


@tf.function
def train_step(real_images, z):
    fake = generator(z)
    combined = tf.concat([fake, real_images], axis=0)
    labels = tf.concat([tf.ones((32, 1)), tf.zeros((32, 1))], axis=0)
    with tf.GradientTape() as tape:
        d_loss = loss_fn(labels, discriminator(combined))
    grads = tape.gradient(d_loss, discriminator.trainable_weights)
    d_optimizer.apply_gradients(zip(grads, discriminator.trainable_weights))
    with tf.GradientTape() as tape:
        g_loss = loss_fn(tf.zeros((32, 1)), discriminator(generator(z)))
    grads = tape.gradient(g_loss, generator.trainable_weights)
    g_optimizer.apply_gradients(zip(grads, generator.trainable_weights))
    return d_loss, g_loss


model = generator
history = {"loss": []}
for epoch in range(3):
    for step, batch in enumerate(dataset):
        d_loss, g_loss = train_step(batch, noise[step])
    history["loss"].append(float(g_loss))
    print(f"loop: epoch {epoch} d_loss {float(d_loss):.6f} g_loss {float(g_loss):.6f}")
