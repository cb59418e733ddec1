"""Regression: float targets, a mean-squared-error loss, an MAE metric.

    python -m ctl.main --config=configs/regression.py --workdir=/tmp/ctl/regression

A task to copy when the targets are numbers: examples generated in memory
(ctl.InMemory, which ctl batches and resumes exactly), a learning-rate
schedule over the run's `total_steps`, Keras metrics for training and
evaluation, and a whole-pass result (R²) computed in `eval_end` from the
per-example outputs of `eval_step`.
"""

import keras
import ml_collections
import numpy as np
import tensorflow as tf

import ctl

NUM_FEATURES = 4
# The examples come from these seeds, not config.seed: another config.seed
# changes the initialisation and the order of examples, never the data.
_TRAIN_SEED, _EVAL_SEED = 1, 2


def make_examples(num_examples: int, noise: float,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Inputs uniform in [-1, 1]^4; targets a smooth function plus noise.

  Returns:
    float32 features [num_examples, 4] and targets [num_examples, 1].
  """
  rng = np.random.default_rng(seed)
  x = rng.uniform(-1, 1, (num_examples, NUM_FEATURES))
  y = np.sin(np.pi * x[:, 0]) + x[:, 1] * x[:, 2] + 0.5 * x[:, 3]**2
  y += rng.normal(0, noise, num_examples)
  return x.astype(np.float32), y[:, None].astype(np.float32)


def build_model(config: ml_collections.ConfigDict) -> keras.Model:
  """A multilayer perceptron with one linear output (the `model` section)."""
  layers = [keras.Input((NUM_FEATURES,))]
  layers += [keras.layers.Dense(config.width, activation='gelu')
             for _ in range(config.depth)]
  layers.append(keras.layers.Dense(1))
  return keras.Sequential(layers)


class Regression(ctl.Task):
  """Fits y = sin(pi x0) + x1 x2 + x3^2 / 2 + noise."""

  def build(self) -> None:
    self.model = build_model(self.config.model)
    # total_steps is set before build, so a schedule can span the run.
    schedule = keras.optimizers.schedules.CosineDecay(
        self.config.optimizer.learning_rate, decay_steps=self.total_steps)
    self.optimizer = keras.optimizers.Adam(schedule)
    # Slots built now: a restored checkpoint must find them, and lazily
    # built slots fail with several replicas.
    self.optimizer.build(self.model.trainable_variables)
    self.train_metrics = [keras.metrics.MeanAbsoluteError(name='mae')]
    self.eval_metrics = [keras.metrics.MeanAbsoluteError(name='mae')]

  def train_data(self, context: tf.distribute.InputContext) -> ctl.InMemory:
    del context  # ctl gives each worker and replica its share itself.
    data = self.config.data
    return ctl.InMemory(make_examples(data.num_train, data.noise, _TRAIN_SEED))

  def eval_data(self, context: tf.distribute.InputContext) -> ctl.InMemory:
    del context
    data = self.config.data
    return ctl.InMemory(make_examples(data.num_eval, data.noise, _EVAL_SEED))

  def train_step(self, batch, ctx: ctl.StepContext) -> dict:
    features, targets = batch
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      predictions = self.model(features, training=True)
      per_example_loss = tf.reduce_mean(tf.square(predictions - targets),
                                        axis=-1)
      # Divided by the global batch: the replicas' gradients then sum (the
      # optimizer sums them) to the gradient of the global mean.
      loss = tf.nn.compute_average_loss(
          per_example_loss, global_batch_size=ctx.global_batch_size)
    gradients = tape.gradient(loss, variables)
    self.optimizer.apply_gradients(zip(gradients, variables))
    for metric in self.train_metrics:
      metric.update_state(targets, predictions)
    return {'loss': tf.reduce_mean(per_example_loss),
            'learning_rate': tf.cast(self.optimizer.learning_rate, tf.float32)}

  def eval_step(self, batch, ctx: ctl.StepContext) -> dict:
    del ctx
    features, targets = batch
    predictions = self.model(features, training=False)
    for metric in self.eval_metrics:
      metric.update_state(targets, predictions)
    # Scalars are averaged over the pass; the per-example rows are gathered
    # from every replica and handed to eval_end.
    return {'loss': tf.reduce_mean(tf.square(predictions - targets)),
            'prediction': predictions[:, 0], 'target': targets[:, 0]}

  def eval_end(self, name: str, outputs: dict, results: dict) -> dict:
    del name, results
    residual = outputs['target'] - outputs['prediction']
    spread = outputs['target'] - outputs['target'].mean()
    return {'r2': float(1 - np.sum(residual**2) / np.sum(spread**2)),
            'residual': ctl.Histogram(residual)}
