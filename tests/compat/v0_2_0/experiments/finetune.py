"""Fine-tuning: a backbone trained on one task, a new head on another.

    python -m ctl.main --config=configs/finetune.py:pretrain --workdir=/tmp/ctl/pretrain
    python -m ctl.main --config=configs/finetune.py --workdir=/tmp/ctl/finetune \
        --config.init_from=/tmp/ctl/pretrain

The pretraining run learns the digits 0-4 (a 5-way head); the fine-tuning
run takes only its backbone (`config.init_select = ('backbone',)`), puts a
new 10-way head on it, keeps the backbone frozen for the first
`finetune.freeze_steps` steps (its gradients are zeroed by a Python `if` on
`ctx.step`, which works on any number of replicas), then trains it at
`finetune.backbone_lr_factor` times the head's learning rate with an
optimizer of its own.
"""

import keras
import ml_collections
import numpy as np
import tensorflow as tf

import ctl
from ctl.data import datasets


def _digits(config: ml_collections.ConfigDict, split: str):
  data = datasets.load_digits(config.data)
  images, labels = getattr(data, split).features, getattr(data, split).labels
  keep = labels < config.num_classes  # Pretraining: the first classes.
  features = images[keep].reshape(-1, 64).astype(np.float32) / 16
  return features, labels[keep]


class FineTune(ctl.Task):
  """A backbone (two dense layers) and a head, each a Keras model."""

  def build(self):
    config = self.config
    self.backbone = keras.Sequential([
        keras.Input((64,)), keras.layers.Dense(64, activation='relu'),
        keras.layers.Dense(32, activation='relu')], name='backbone')
    self.head = keras.Sequential([
        keras.Input((32,)), keras.layers.Dense(config.num_classes)],
        name='head')
    learning_rate = config.optimizer.learning_rate
    self.head_optimizer = keras.optimizers.Adam(learning_rate)
    self.backbone_optimizer = keras.optimizers.Adam(
        learning_rate * config.finetune.backbone_lr_factor)
    self.head_optimizer.build(self.head.trainable_variables)
    self.backbone_optimizer.build(self.backbone.trainable_variables)
    self.train_metrics = [keras.metrics.SparseCategoricalAccuracy('accuracy')]
    self.eval_metrics = [keras.metrics.SparseCategoricalAccuracy('accuracy')]

  def train_data(self, context):
    del context
    return ctl.InMemory(_digits(self.config, 'train'))

  def eval_data(self, context):
    del context
    return ctl.InMemory(_digits(self.config, 'eval'))

  def train_step(self, batch, ctx):
    x, y = batch
    backbone = self.backbone.trainable_variables
    head = self.head.trainable_variables
    with tf.GradientTape() as tape:
      logits = self.head(self.backbone(x, training=True), training=True)
      per_example = keras.losses.sparse_categorical_crossentropy(
          y, logits, from_logits=True)
      loss = tf.nn.compute_average_loss(
          per_example, global_batch_size=ctx.global_batch_size)
    gradients = tape.gradient(loss, backbone + head)
    backbone_gradients = gradients[:len(backbone)]
    if ctx.step < self.config.finetune.freeze_steps:
      # Frozen: zero gradients leave Adam's weights and slots as they are.
      backbone_gradients = [tf.zeros_like(g) for g in backbone_gradients]
    self.backbone_optimizer.apply_gradients(zip(backbone_gradients, backbone))
    self.head_optimizer.apply_gradients(zip(gradients[len(backbone):], head))
    self.train_metrics[0].update_state(y, logits)
    return {'loss': tf.reduce_mean(per_example)}

  def eval_step(self, batch, ctx):
    x, y = batch
    self.eval_metrics[0].update_state(y, self.head(self.backbone(x)))
    return {}
