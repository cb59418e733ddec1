"""Losses and metrics of the classification task, chosen by name."""

from collections.abc import Callable

import keras
import tensorflow as tf

from ctl import registry

LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def build_loss(name: str) -> LossFn:
  """Returns loss(labels, logits) -> per-example losses, shape [batch].

  A user's own is `package.module:function`, that function being the loss.
  """
  return registry.resolve(name, _LOSSES, 'loss')


def sparse_categorical_crossentropy(labels, logits):
  """Per-example cross-entropy of integer labels and logits."""
  return keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                      from_logits=True)


_LOSSES = {'sparse_categorical_crossentropy': sparse_categorical_crossentropy}


def build_metric(name: str) -> keras.metrics.Metric:
  """A new Keras metric(labels, logits): built in, or a user's
  `package.module:function` returning one."""
  return registry.resolve(name, _METRICS, 'metric')()


_METRICS = {
    'accuracy': lambda: keras.metrics.SparseCategoricalAccuracy('accuracy'),
    'top5_accuracy': lambda: keras.metrics.SparseTopKCategoricalAccuracy(
        k=5, name='top5_accuracy'),
}
