"""Losses of the classification task, chosen by name (config.loss)."""

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
