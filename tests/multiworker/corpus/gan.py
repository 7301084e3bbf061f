"""A GAN: a subclass whose own compile takes two optimizers and a loss, and whose train_step returns
plain tensors ("Wrapping up: an end-to-end GAN example" in "Customizing what happens in fit()")."""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

latent_dim = 8

discriminator = keras.Sequential(
    [keras.Input(shape=(64,)), layers.Dense(32), layers.LeakyReLU(negative_slope=0.2), layers.Dense(1)],
    name="discriminator",
)
generator = keras.Sequential(
    [keras.Input(shape=(latent_dim,)), layers.Dense(32), layers.LeakyReLU(negative_slope=0.2),
     layers.Dense(64, activation="sigmoid")],
    name="generator",
)


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, real_images):
        batch_size = tf.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        generated_images = self.generator(random_latent_vectors)
        combined_images = tf.concat([generated_images, real_images], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))

        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        misleading_labels = tf.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        return {"d_loss": d_loss, "g_loss": g_loss}


keras.utils.set_random_seed(3)
rng = np.random.default_rng(2)
images = (rng.random((1024, 64)) > 0.7).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices(images).shuffle(1024, seed=0).batch(32)

model = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
model.compile(
    d_optimizer=keras.optimizers.Adam(learning_rate=3e-4),
    g_optimizer=keras.optimizers.Adam(learning_rate=3e-4),
    loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
)
history = model.fit(dataset, epochs=8, verbose=2)
