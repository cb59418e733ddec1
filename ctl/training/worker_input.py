"""Each worker's own training input, for parameter-server training.

Asynchronous training has no one order to keep: each worker reads its own
pass over the data. A tf.data pipeline is the task's `train_data`, called
with worker i's own `InputContext` (input pipeline i of the job's workers),
so a pipeline that shards by `context.input_pipeline_id` (as `by_file`
TFRecord files are) reads its own files on each worker, and one shuffled
from a fixed seed does not feed every worker the same batches.
TensorFlow's `create_per_worker_dataset` would give every worker the same
context (`tf_cluster_internals.per_worker_iterator` says why and how this differs).
In-memory data is shuffled on each worker with a seed of its own.
"""

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from ctl import errors
from ctl import task as task_lib
from ctl.runtime import tf_cluster_internals


class PerWorkerInput:
  """The task's training data, a dataset on each worker with its own
  InputContext; has the methods the loop asks of a training input."""

  kind = "each worker's own pass over the task's data"
  checkpointable = {}  # No position can be saved: see README.
  dataset = None
  partitions = None

  def __init__(self, strategy: tf.distribute.Strategy, train_data: Any,
               make_data: Callable[[tf.distribute.InputContext], Any],
               global_batch_size: int):
    """Args as named; train_data: what the task's train_data returned on
    the chief; make_data: the task's train_data, called again for each
    worker's tf.data pipeline.

    Raises:
      ConfigError: for files in one global order, which this strategy
        cannot read yet.
    """
    if not isinstance(train_data, (task_lib.InMemory, tf.data.Dataset)):
      raise errors.ConfigError(
          "distribution.strategy='parameter_server' reads ctl.InMemory "
          "data or a tf.data pipeline; the task's train_data returned "
          f'{type(train_data).__name__}: use one of those, or another '
          'strategy.')
    self._strategy = strategy
    self._data = train_data
    self._make_data = make_data
    self._global_batch_size = global_batch_size
    self._iterator = None

  def make_iterator(self, loops: Any) -> Any:
    """The workers' iterators (one per worker), made once."""
    del loops  # Each worker reads on from where it is.
    if self._iterator is None:
      coordinator = tf.distribute.coordinator.ClusterCoordinator(
          self._strategy)
      self._iterator = tf_cluster_internals.per_worker_iterator(
          coordinator, self._dataset)
    return self._iterator

  def _dataset(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """One worker's batches, endless."""
    if not isinstance(self._data, task_lib.InMemory):
      return self._make_data(context).repeat()
    data = self._data
    # Seeded by the worker's clock too: a worker that comes back does not
    # repeat the order it read before.
    seed = tf.cast(tf.timestamp() * 1e6, tf.int64) % (2**31 - 1)
    seed += context.input_pipeline_id
    tensors = tf.nest.map_structure(tf.constant, data.arrays)

    def one_pass(index):
      return tf.random.experimental.stateless_shuffle(
          tf.range(len(data), dtype=tf.int64), seed=tf.stack([seed, index]))

    def gather(rows):
      batch = tf.nest.map_structure(lambda t: tf.gather(t, rows), tensors)
      return data.preprocess(batch) if data.preprocess else batch

    batches = tf.data.Dataset.counter().map(one_pass).unbatch().batch(
        self._global_batch_size, drop_remainder=True).map(gather)
    return batches.prefetch(1)
