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

from ctl.cluster import distribution


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
    return as_python(self._read())

  def read_and_reset(self) -> dict[str, float | np.ndarray]:
    """read(), then reset(), in one tf.function call."""
    if not self._metrics:
      return {}
    return as_python(self._read_and_reset())

  def reset(self) -> None:
    if self._metrics:
      self._reset()

  def _results(self) -> dict[str, tf.Tensor]:
    results = {}
    for metric in self._metrics:
      result = metric.result()
      # A metric holding others (Keras's compiled metrics) gives a dict.
      results.update(result if isinstance(result, dict) else
                     {metric.name: result})
    return results

  def _reset_all(self) -> None:
    for metric in self._metrics:
      metric.reset_state()

  # One tf.function call each: an eager op per metric would cost a dispatch
  # on the training thread.
  @tf.function(autograph=False)
  def _read(self):
    return self._results()

  @tf.function(autograph=False)
  def _reset(self):
    self._reset_all()

  @tf.function(autograph=False)
  def _read_and_reset(self):
    return self.read_and_reset_in_graph()

  def read_and_reset_in_graph(self) -> dict[str, tf.Tensor]:
    """read_and_reset's ops, in the tf.function being traced (the training
    loop's, at the end of a loop after which a report is due)."""
    results = self._results()
    with tf.control_dependencies(tf.nest.flatten(results)):
      self._reset_all()
    return results


def as_python(results) -> dict[str, float | np.ndarray]:
  return {name: (float(value) if value.shape.rank == 0 else value.numpy())
          for name, value in results.items()}


class WorkerSum:
  """Sums a vector that each worker holds over every worker; one traced
  function, reused."""

  def __init__(self, strategy: tf.distribute.Strategy):
    self._strategy = strategy
    self._one_worker = (strategy.num_replicas_in_sync ==
                        distribution.local_replicas(strategy))
    self._local_replicas = distribution.local_replicas(strategy)

  def __call__(self, local: np.ndarray) -> np.ndarray:
    if self._one_worker:
      return local
    return self._total(tf.constant(local / self._local_replicas,
                                   tf.float64)).numpy()

  @tf.function(autograph=False)
  def _total(self, value):
    return self._strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        self._strategy.run(lambda: tf.identity(value)), axis=None)
