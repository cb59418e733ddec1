"""Global gradient clipping after the all-reduce, and a weight average (EMA).

    python -m ctl.main --config=configs/clip_ema.py --workdir=/tmp/ctl/clip_ema

A task to copy when the step must see the summed gradients: it all-reduces
them itself (`ctx.all_reduce_sum`), clips the sum by its global norm, and
applies it as summed (`ctx.apply_reduced_gradients`). Keras's own
`clipnorm` / `global_clipnorm` clip each replica's share before the sum,
which bounds neither the update nor its direction.

After each update it moves an exponential moving average (EMA) of the
weights, kept in a second model built in `build`, and evaluates that model.
Keras's `use_ema=True` optimizers also keep an average, but put it into the
model only at the end of training; here it is evaluated all along, beside
the raw weights (`accuracy` and `raw_accuracy`), and checkpointed with them.
"""

import keras
import ml_collections
import tensorflow as tf

import ctl
from ctl.data import datasets


def build_model(config: ml_collections.ConfigDict,
                num_classes: int) -> keras.Model:
  """A one-hidden-layer perceptron on 8x8 images, logits out."""
  return keras.Sequential([
      keras.Input((8, 8)),
      keras.layers.Flatten(),
      keras.layers.Dense(config.width, activation='relu'),
      keras.layers.Dense(num_classes),
  ])


def scale(batch):
  """uint8 pixels (0..16) to floats in [0, 1], inside the step."""
  images, labels = batch
  return tf.cast(images, tf.float32) / 16, labels


class ClipEma(ctl.Task):
  """Classifies the 8x8 digits with SGD, clipped global gradients and an EMA."""

  def build(self) -> None:
    self.model = self.build_model()
    # The average starts at the initial weights; a clone has its own.
    self.ema_model = keras.models.clone_model(self.model)
    self.ema_model.set_weights(self.model.get_weights())
    optimizer = self.config.optimizer
    self.optimizer = keras.optimizers.SGD(optimizer.learning_rate,
                                          momentum=optimizer.momentum)
    self.optimizer.build(self.model.trainable_variables)
    self.eval_metrics = [
        keras.metrics.SparseCategoricalAccuracy(name='accuracy'),
        keras.metrics.SparseCategoricalAccuracy(name='raw_accuracy')]

  def build_model(self) -> keras.Model:
    """The model to train (a test replaces it with one of known gradients)."""
    return build_model(self.config.model, num_classes=10)

  def per_example_loss(self, labels: tf.Tensor,
                       logits: tf.Tensor) -> tf.Tensor:
    """Cross-entropy of each example (a test replaces it too)."""
    return keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                        from_logits=True)

  def train_data(self, context: tf.distribute.InputContext) -> ctl.InMemory:
    del context  # ctl gives each worker and replica its share itself.
    split = self._digits().train
    return ctl.InMemory((split.features, split.labels), preprocess=scale)

  def eval_data(self, context: tf.distribute.InputContext) -> ctl.InMemory:
    del context
    split = self._digits().eval
    return ctl.InMemory((split.features, split.labels), preprocess=scale)

  def train_step(self, batch, ctx: ctl.StepContext) -> dict:
    images, labels = batch
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      per_example_loss = self.per_example_loss(
          labels, self.model(images, training=True))
      # Each replica's loss is divided by the global batch, so the sum of
      # the replicas' gradients is the gradient of the global mean.
      loss = tf.nn.compute_average_loss(
          per_example_loss, global_batch_size=ctx.global_batch_size)
    gradients = ctx.all_reduce_sum(tape.gradient(loss, variables))
    gradients, norm = tf.clip_by_global_norm(gradients,
                                             self.config.optimizer.clip_norm)
    # As summed: optimizer.apply_gradients would sum them over replicas again.
    ctx.apply_reduced_gradients(self.optimizer, zip(gradients, variables))
    self._update_ema(ctx.step)
    return {'loss': tf.reduce_mean(per_example_loss),
            'gradient_norm': norm,  # Before clipping.
            'clipped': tf.cast(norm > self.config.optimizer.clip_norm,
                               tf.float32)}  # The share of steps clipped.

  def _update_ema(self, step: tf.Tensor) -> None:
    """ema = decay * ema + (1 - decay) * weights.

    The decay rises from 0.1 to ema.decay over the first steps (as in
    tf.train.ExponentialMovingAverage's num_updates), so that the average
    soon forgets the random initial weights. Each replica updates its own
    copy from the same new weights: the copies stay equal without any
    communication.
    """
    step = tf.cast(step, tf.float32)
    decay = tf.minimum(self.config.ema.decay, (1 + step) / (10 + step))
    for average, weight in zip(self.ema_model.weights, self.model.weights):
      average.assign(decay * average + (1 - decay) * weight)

  def eval_step(self, batch, ctx: ctl.StepContext) -> dict:
    del ctx
    images, labels = batch
    logits = self.ema_model(images, training=False)
    accuracy, raw_accuracy = self.eval_metrics
    accuracy.update_state(labels, logits)
    raw_accuracy.update_state(labels, self.model(images, training=False))
    return {'loss': tf.reduce_mean(self.per_example_loss(labels, logits))}

  def _digits(self) -> datasets.Data:
    """The digits' train and eval splits, read once (kept off the
    checkpoint: a plain attribute, not a trackable one)."""
    if not hasattr(self, '_loaded'):
      self._loaded = datasets.load_digits(self.config.data)
    return self._loaded
