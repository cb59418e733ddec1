"""Losses and metrics, chosen by name in the config.

Metrics are Keras metrics built inside `strategy.scope()`: their variables
are sync-on-read sums, so each replica updates its own copy and a read
reduces them across replicas and workers. A read is therefore a collective
under MultiWorkerMirroredStrategy: every worker must read at the same step.
"""

from collections.abc import Callable, Sequence

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

_METRICS = {
    'accuracy': lambda: keras.metrics.SparseCategoricalAccuracy('accuracy'),
    'top5_accuracy': lambda: keras.metrics.SparseTopKCategoricalAccuracy(
        k=5, name='top5_accuracy'),
}


class MetricSet:
  """The mean loss and the configured metrics of one phase (train or eval)."""

  def __init__(self, names: Sequence[str]):
    """Builds the metrics; call inside `strategy.scope()`.

    Args:
      names: built-in metric names, or `package.module:function` for a
        function that returns a new keras.metrics.Metric.
    """
    self.loss = keras.metrics.Mean('loss')
    self._metrics = {
        name: registry.resolve(name, _METRICS, 'metric')() for name in names
    }

  def update(self, labels, logits, loss, weights=None) -> None:
    """Adds one replica's batch; loss is its mean (or per-example) loss."""
    self.loss.update_state(loss, sample_weight=weights)
    for metric in self._metrics.values():
      metric.update_state(labels, logits, sample_weight=weights)

  @tf.function(autograph=False)
  def _read_and_reset(self) -> dict[str, tf.Tensor]:
    # One call: each eager op would cost a dispatch on the training thread.
    results = {'loss': self.loss.result()}
    results.update(
        {name: metric.result() for name, metric in self._metrics.items()})
    with tf.control_dependencies(list(results.values())):
      for metric in (self.loss, *self._metrics.values()):
        metric.reset_state()
    return results

  def read_and_reset(self) -> dict[str, float]:
    """Returns {name: value} across replicas and workers, then starts over."""
    return {name: float(value)
            for name, value in self._read_and_reset().items()}
