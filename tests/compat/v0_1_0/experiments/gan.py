"""A GAN on 2-D points: two networks, two optimizers, one train_step.

    python -m ctl.main --config=configs/gan.py --workdir=/tmp/ctl/gan

A task to copy when a step trains more than one model: a generator maps
noise to points, a discriminator tells them from points of a ring of
Gaussians, each with its own Adam, both updated in every step. The noise is
drawn with stateless ops from `ctx.seed` (a seed distinct for each step and
replica), so that a run resumed from a checkpoint draws the same noise as
an uninterrupted one. Evaluation draws samples from fixed noise and
measures, in `eval_end`, how many of the ring's modes they cover and how
close they lie to one.
"""

import keras
import ml_collections
import numpy as np
import tensorflow as tf

import ctl

# The real points and the eval noise come from these seeds, not config.seed.
_DATA_SEED, _EVAL_NOISE_SEED = 1, 2
# Samples closer than this many standard deviations to a mode are good ones.
_GOOD_DISTANCE = 3
# A mode counts as covered when this share of an even split of all samples
# lies near it: a generator stuck on a few modes covers only those.
_COVERED_SHARE = 0.25


def modes(config: ml_collections.ConfigDict) -> np.ndarray:
  """The centres of the ring's Gaussians (the `data` section), [modes, 2]."""
  angles = 2 * np.pi * np.arange(config.num_modes) / config.num_modes
  return config.radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)


def make_points(config: ml_collections.ConfigDict, seed: int) -> np.ndarray:
  """config.num_train points from a mixture of Gaussians on a ring."""
  rng = np.random.default_rng(seed)
  centres = modes(config)[rng.integers(config.num_modes, size=config.num_train)]
  points = centres + rng.normal(0, config.std, centres.shape)
  return points.astype(np.float32)


def mlp(inputs: int, width: int, depth: int, outputs: int) -> keras.Model:
  """A multilayer perceptron with leaky-ReLU hidden layers."""
  layers = [keras.Input((inputs,))]
  layers += [keras.layers.Dense(width, activation='leaky_relu')
             for _ in range(depth)]
  layers.append(keras.layers.Dense(outputs))
  return keras.Sequential(layers)


class Gan(ctl.Task):
  """Trains a generator of 2-D points against a discriminator."""

  def build(self) -> None:
    model, optimizer = self.config.model, self.config.optimizer
    self.generator = mlp(model.latent_dim, model.width, model.depth, 2)
    self.discriminator = mlp(2, model.width, model.depth, 1)
    # beta_1 = 0.5, as GANs usually train: less momentum in a moving game.
    self.generator_optimizer = keras.optimizers.Adam(
        optimizer.generator_learning_rate, beta_1=0.5)
    self.discriminator_optimizer = keras.optimizers.Adam(
        optimizer.discriminator_learning_rate, beta_1=0.5)
    # Slots built now, so that a restored checkpoint finds them.
    self.generator_optimizer.build(self.generator.trainable_variables)
    self.discriminator_optimizer.build(self.discriminator.trainable_variables)

  def train_data(self, context: tf.distribute.InputContext) -> ctl.InMemory:
    del context  # ctl gives each worker and replica its share itself.
    return ctl.InMemory(make_points(self.config.data, _DATA_SEED))

  def eval_data(self, context: tf.distribute.InputContext) -> ctl.InMemory:
    del context
    noise = np.random.default_rng(_EVAL_NOISE_SEED).normal(
        size=(self.config.eval_samples, self.config.model.latent_dim))
    return ctl.InMemory(noise.astype(np.float32))

  def train_step(self, real, ctx: ctl.StepContext) -> dict:
    # Fresh noise for each update: two seeds split from this step's.
    discriminator_seed, generator_seed = tf.unstack(
        tf.random.experimental.stateless_split(ctx.seed, 2))
    discriminator_loss = self._train_discriminator(
        real, self._noise(real, discriminator_seed), ctx.global_batch_size)
    generator_loss = self._train_generator(
        self._noise(real, generator_seed), ctx.global_batch_size)
    return {'discriminator_loss': discriminator_loss,
            'generator_loss': generator_loss}

  def _noise(self, real: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """A batch of latent vectors, as many as the real points."""
    shape = [tf.shape(real)[0], self.config.model.latent_dim]
    return tf.random.stateless_normal(shape, seed=seed)

  def _train_discriminator(self, real, noise, global_batch_size) -> tf.Tensor:
    """One step of the discriminator: real points 1, generated ones 0."""
    variables = self.discriminator.trainable_variables
    fake = self.generator(noise, training=True)
    with tf.GradientTape() as tape:
      real_logits = self.discriminator(real, training=True)[:, 0]
      fake_logits = self.discriminator(fake, training=True)[:, 0]
      per_example_loss = (_cross_entropy(tf.ones_like(real_logits), real_logits)
                          + _cross_entropy(tf.zeros_like(fake_logits),
                                           fake_logits))
      loss = tf.nn.compute_average_loss(per_example_loss,
                                        global_batch_size=global_batch_size)
    gradients = tape.gradient(loss, variables)
    self.discriminator_optimizer.apply_gradients(zip(gradients, variables))
    return tf.reduce_mean(per_example_loss)

  def _train_generator(self, noise, global_batch_size) -> tf.Tensor:
    """One step of the generator: make the discriminator say 1."""
    variables = self.generator.trainable_variables
    with tf.GradientTape() as tape:
      fake_logits = self.discriminator(self.generator(noise, training=True),
                                       training=True)[:, 0]
      # The non-saturating loss: strong gradients while fakes are poor.
      per_example_loss = _cross_entropy(tf.ones_like(fake_logits), fake_logits)
      loss = tf.nn.compute_average_loss(per_example_loss,
                                        global_batch_size=global_batch_size)
    gradients = tape.gradient(loss, variables)
    self.generator_optimizer.apply_gradients(zip(gradients, variables))
    return tf.reduce_mean(per_example_loss)

  def eval_step(self, noise, ctx: ctl.StepContext) -> dict:
    del ctx
    samples = self.generator(noise, training=False)
    fooled = tf.sigmoid(self.discriminator(samples, training=False))
    # A scalar, averaged over the pass; the samples go to eval_end.
    return {'discriminator_belief': tf.reduce_mean(fooled),
            'sample': samples}

  def eval_end(self, name: str, outputs: dict) -> dict:
    del name
    data = self.config.data
    samples, centres = outputs['sample'], modes(data)
    distances = np.linalg.norm(samples[:, None] - centres[None], axis=-1)
    nearest = distances.argmin(axis=1)
    good = distances.min(axis=1) < _GOOD_DISTANCE * data.std
    counts = np.bincount(nearest[good], minlength=data.num_modes)
    covered = counts >= _COVERED_SHARE * len(samples) / data.num_modes
    return {
        'good_samples': float(good.mean()),  # Share near some mode.
        'modes_covered': float(covered.sum()),
        'mean_distance': float(distances.min(axis=1).mean()),
        # The samples' distances from the centre: a peak at data.radius.
        'sample_radius': ctl.Histogram(np.linalg.norm(samples, axis=1)),
    }


def _cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
  """Per-example binary cross-entropy on logits."""
  return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
