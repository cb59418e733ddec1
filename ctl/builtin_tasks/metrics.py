"""Metrics of the classification task, chosen by name (config.metrics)."""

import keras

from ctl import registry


def build_metric(name: str) -> keras.metrics.Metric:
  """A new Keras metric(labels, logits): built in, or a user's
  `package.module:function` returning one."""
  return registry.resolve(name, _METRICS, 'metric')()


_METRICS = {
    'accuracy': lambda: keras.metrics.SparseCategoricalAccuracy('accuracy'),
    'top5_accuracy': lambda: keras.metrics.SparseTopKCategoricalAccuracy(
        k=5, name='top5_accuracy'),
}
