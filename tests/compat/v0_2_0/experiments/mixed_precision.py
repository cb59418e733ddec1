"""A large batch in little memory: mixed precision and gradient accumulation
in a task's own step.

    python -m ctl.main --config=configs/mixed_precision.py --workdir=/tmp/ctl/mixed_precision

The step to copy when the batch does not fit: the model computes in float16
(`model.dtype_policy`), a keras.optimizers.LossScaleOptimizer scales the
loss, `ctx.accumulate` runs the replica's batch as `accumulate_steps`
micro-batches and sums their gradients, and `ctx.apply_gradients` sums them
over the replicas once and applies them: one optimizer step per training
step. Summing before applying is what makes mixed precision work on more
than one replica (BUILD.md, "Mixed precision"); written with
`optimizer.apply_gradients`, one replica's overflow reaches the weights.
"""

import keras
import numpy as np
import tensorflow as tf

import ctl

NUM_FEATURES, NUM_CLASSES = 32, 10
_TRAIN_SEED, _EVAL_SEED = 1, 2


def make_examples(num_examples: int, seed: int
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Ten overlapping Gaussian blobs: features [n, 32], int32 labels [n]."""
  centres = np.random.default_rng(0).normal(0, 1, (NUM_CLASSES, NUM_FEATURES))
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, NUM_CLASSES, num_examples)
  features = centres[labels] + rng.normal(0, 1.5, (num_examples, NUM_FEATURES))
  return features.astype(np.float32), labels.astype(np.int32)


class MixedPrecisionClassifier(ctl.Task):
  """An MLP classifier whose step is written for mixed precision and
  gradient accumulation."""

  def build(self) -> None:
    config = self.config
    self.model = keras.Sequential([
        keras.Input((NUM_FEATURES,)),
        keras.layers.Dense(config.model.width, activation='relu',
                           dtype=config.model.dtype_policy),
        keras.layers.Dense(NUM_CLASSES, dtype=config.model.dtype_policy),
    ])
    optimizer = keras.optimizers.Adam(config.optimizer.learning_rate)
    if config.model.dtype_policy == 'mixed_float16':
      # Its dynamic loss scale is a variable: checkpointed, resumed exactly.
      optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    self.optimizer = optimizer
    self.optimizer.build(self.model.trainable_variables)
    self.train_metrics = [keras.metrics.SparseCategoricalAccuracy('accuracy')]
    self.eval_metrics = [keras.metrics.SparseCategoricalAccuracy('accuracy')]

  def train_data(self, context: tf.distribute.InputContext) -> ctl.InMemory:
    del context
    return ctl.InMemory(make_examples(self.config.data.num_train, _TRAIN_SEED))

  def eval_data(self, context: tf.distribute.InputContext) -> ctl.InMemory:
    del context
    return ctl.InMemory(make_examples(self.config.data.num_eval, _EVAL_SEED))

  def train_step(self, batch, ctx: ctl.StepContext) -> dict:
    variables = self.model.trainable_variables

    def compute(micro_batch):  # Called accumulate_steps times a step.
      features, labels = micro_batch
      with tf.GradientTape() as tape:
        # The logits back in float32 for the loss.
        logits = tf.cast(self.model(features, training=True), tf.float32)
        per_example_loss = keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True)
        # Over the global batch, as ever: the micro-batches' gradients
        # then sum to the whole batch's.
        loss = tf.nn.compute_average_loss(
            per_example_loss, global_batch_size=ctx.global_batch_size)
        scaled_loss = self.optimizer.scale_loss(loss)  # As is, in float32.
      for metric in self.train_metrics:
        metric.update_state(labels, logits)
      return (tape.gradient(scaled_loss, variables),
              {'loss': tf.reduce_mean(per_example_loss)})

    gradients, logs = ctx.accumulate(compute, batch)
    # Summed over the replicas, then applied (the loss scale's finite check
    # sees the sum): not optimizer.apply_gradients.
    ctx.apply_gradients(self.optimizer, zip(gradients, variables))
    return logs

  def loop_logs(self) -> dict:
    scale = getattr(self.optimizer, 'dynamic_scale', None)
    return {} if scale is None else {'loss_scale': scale}

  def eval_step(self, batch, ctx: ctl.StepContext) -> dict:
    del ctx
    features, labels = batch
    logits = tf.cast(self.model(features, training=False), tf.float32)
    for metric in self.eval_metrics:
      metric.update_state(labels, logits)
    return {'loss': tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True))}
