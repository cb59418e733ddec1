"""Reading Keras metrics and sums across replicas and workers.

Metrics built inside `strategy.scope()` hold sync-on-read variables: each
replica updates its own copy and a read reduces them across replicas and
workers. A read is therefore a collective under MultiWorkerMirroredStrategy:
every worker must read at the same step.
"""

from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from ctl.runtime import distribution


class MetricReader:
  """Reads and resets a list of Keras metrics in one tf.function call each."""

  def __init__(self, metrics: Sequence[keras.metrics.Metric]):
    self._metrics = list(metrics)
    names = [metric.name for metric in self._metrics]
    duplicates = {name for name in names if names.count(name) > 1}
    if duplicates:
      raise ValueError(f'Metrics share the names {sorted(duplicates)}: give '
                       'each a distinct name=.')

  def read(self) -> dict[str, float | np.ndarray]:
    """{name: result}: floats for scalars, arrays for the rest."""
    if not self._metrics:
      return {}
    return {name: (float(value) if value.shape.rank == 0 else value.numpy())
            for name, value in self._read().items()}

  def read_and_reset(self) -> dict[str, float | np.ndarray]:
    results = self.read()
    self.reset()
    return results

  def reset(self) -> None:
    if self._metrics:
      self._reset()

  @tf.function(autograph=False)
  def _read(self):
    # One call: each eager op would cost a dispatch on the training thread.
    results = {}
    for metric in self._metrics:
      result = metric.result()
      # A metric holding others (Keras's compiled metrics) gives a dict.
      results.update(result if isinstance(result, dict) else
                     {metric.name: result})
    return results

  @tf.function(autograph=False)
  def _reset(self):
    for metric in self._metrics:
      metric.reset_state()


def sum_over_workers(strategy: tf.distribute.Strategy,
                     local: np.ndarray) -> np.ndarray:
  """Sums a vector that each worker holds over every worker."""
  local_replicas = distribution.local_replicas(strategy)
  if strategy.num_replicas_in_sync == local_replicas:
    return local  # One worker.
  value = tf.constant(local / local_replicas, tf.float64)
  return _sum_function(strategy)(value).numpy()


def _sum_function(strategy):
  @tf.function(autograph=False)
  def total(value):
    return strategy.reduce(tf.distribute.ReduceOp.SUM,
                           strategy.run(lambda: tf.identity(value)), axis=None)
  return total
