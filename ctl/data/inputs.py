"""A task's training data as the step loop reads it, and its saved position.

Three kinds, one interface (used inside ctl's tf.functions):
- `InMemoryInput`: ctl.InMemory arrays. The position is the step: each
  worker's pipeline, read through a plain iterator, yields each loop's
  example indices, a pure function of (seed, step), and each replica
  gathers its batch.
- `GlobalOrderInput`: files read in one global order over a fixed number
  of partitions (`ctl.data.global_batches.GlobalBatches`, from TFRecord or
  TFDS), each worker reading its own. The position is the step too: each
  worker's pipeline starts at the resumed step's global batch, whatever
  the number of workers (of those that divide the partitions) that wrote
  the checkpoint.
- `DatasetInput`: a task's own tf.data.Dataset of per-replica batches, any
  structure. Each worker reads its dataset through a plain iterator, whose
  state is checkpointed: the iterators of `distribute_datasets_from_function`
  cannot be (TensorFlow issue 56372), a plain one can (TF_NOTES.md). The
  worker hands consecutive elements to its local replicas, as
  `distribute_datasets_from_function` does.

The step loop (ctl/training/steps.py) calls each input twice: once a loop,
`loop_data(iterator, num_steps)` (in memory: the loop's example indices,
read from the iterator at once; tf.data: nothing, its iterator is read step
by step), and once a step, `batches(loop_data, i)`: step i's batch of every
replica, a distributed value for `strategy.run`.
"""

from collections.abc import Iterator, Mapping
import sys
from typing import Any, Protocol, TYPE_CHECKING

import tensorflow as tf

from ctl import errors
from ctl.data import in_memory
from ctl.data import resumable

if TYPE_CHECKING:  # Imported by a task that reads files, when it does.
  from ctl.data import global_batches


class Loops(Protocol):
  """The loops an iterator is made for (a ctl.training.loop_plan.LoopPlan)."""

  start: int  # The first loop's first step.

  def __iter__(self) -> Iterator[tuple[int, int]]:
    """Each loop's (first step, end step)."""


class TrainInput(Protocol):
  """A task's training data as the step loop reads it: InMemoryInput,
  GlobalOrderInput or DatasetInput (see above)."""

  kind: str  # What it reads, for messages.
  # What a checkpoint saves of it ({} when the step is the position).
  checkpointable: Mapping[str, Any]
  dataset: tf.data.Dataset | None  # The task's own pipeline, if any.
  partitions: int | None  # Files in the global order: their partitions.

  def make_iterator(self, loops: Loops) -> Iterator[Any]:
    """The iterator the given loops read, from their first step on."""

  def loop_data(self, iterator: Iterator[Any], num_steps: tf.Tensor) -> Any:
    """What a loop of num_steps steps reads at once (or None)."""

  def batches(self, loop_data: Any, step_in_loop: tf.Tensor) -> Any:
    """Step step_in_loop's batch of every replica, for strategy.run."""


class InMemoryInput:
  """Batches gathered from arrays, in an order decided by (seed, step)."""

  kind = 'in-memory data'
  checkpointable = {}  # The step is the position: nothing else to save.
  dataset = None  # No pipeline of the task's own.
  partitions = None  # Not files in the global order.

  def __init__(self, strategy: tf.distribute.Strategy,
               data: in_memory.InMemory, *, context: tf.distribute.InputContext,
               seed: int, global_batch_size: int, steps_per_epoch: int,
               num_local_replicas: int, pad_loops_to: int | None = None):
    """Args as named; context: this worker's place among the replicas;
    pad_loops_to: steps_per_loop when a whole loop is one XLA program (its
    input then has one shape)."""
    self._strategy = strategy
    self._data = data
    self._context = context
    self._seed = seed
    self._global_batch_size = global_batch_size
    self._steps_per_epoch = steps_per_epoch
    self._num_local_replicas = num_local_replicas
    self._pad_loops_to = pad_loops_to
    data.materialize()

  def make_iterator(self, loops: Loops) -> Iterator[Any]:
    """The iterator over the given loops' (first step, end step).

    A plain iterator of this worker's pipeline, not a distributed one: on 2
    workers, MultiWorkerMirroredStrategy's distributed iterator (a
    multi-device iterator per worker) made the steps of its loop 8-14%
    slower, with or without its agreement on the end of data
    (BENCHMARKS.md, "The 2-worker step alone and the distributed
    iterator").
    """
    with tf.device('/cpu:0'):
      return iter(in_memory.train_chunks(
          len(self._data), seed=self._seed,
          global_batch_size=self._global_batch_size,
          steps_per_epoch=self._steps_per_epoch, loops=loops,
          context=self._context))

  def loop_data(self, iterator, num_steps: tf.Tensor):
    """Each local replica's example indices of the loop's steps: the
    pipeline's next element for each, in order."""
    if self._pad_loops_to:  # One replica.
      return tf.pad(next(iterator),
                    [[0, self._pad_loops_to - num_steps], [0, 0]])
    return _next_per_replica(self._strategy, iterator,
                             self._num_local_replicas)

  def batches(self, rows, step_in_loop: tf.Tensor) -> Any:
    """Each replica gathers its batch of the step from the arrays."""
    return self._strategy.run(
        lambda replica_rows: self._data.gather(replica_rows[step_in_loop]),
        args=(rows,))


class DatasetInput:
  """Per-replica batches from each worker's own tf.data.Dataset."""

  kind = "the task's tf.data pipeline"
  partitions = None  # Not files in the global order.

  def __init__(self, strategy: tf.distribute.Strategy,
               dataset: tf.data.Dataset, num_local_replicas: int):
    self._strategy = strategy
    self._num_local_replicas = num_local_replicas
    self.dataset = dataset  # Whose position is saved.
    with tf.device('/cpu:0'):  # Repeated, and resumable exactly.
      self._iterator = iter(resumable.resumable(dataset))
    self.checkpointable = {'iterator': self._iterator}

  def make_iterator(self, loops: Loops) -> Iterator[Any]:
    del loops  # The iterator's own state is the position.
    return self._iterator

  def loop_data(self, iterator, num_steps: tf.Tensor):
    del iterator, num_steps  # Read step by step, in batches().
    return None

  def batches(self, loop_data, step_in_loop: tf.Tensor) -> Any:
    """The next element of the iterator for each local replica."""
    del loop_data, step_in_loop
    return _next_per_replica(self._strategy, self._iterator,
                             self._num_local_replicas)


class GlobalOrderInput(DatasetInput):
  """Per-replica batches of files in one global order: nothing saved."""

  kind = 'files in one global order'
  checkpointable = {}  # The step is the position.
  dataset = None  # Made at make_iterator, from the step.

  def __init__(self, strategy: tf.distribute.Strategy,
               data: 'global_batches.GlobalBatches', *,
               context: tf.distribute.InputContext, seed: int,
               global_batch_size: int, num_local_replicas: int):
    # pylint: disable=super-init-not-called
    data.check_workers(context.num_input_pipelines, global_batch_size)
    self.partitions = data.partitions(global_batch_size)
    self._strategy = strategy
    self._num_local_replicas = num_local_replicas
    self._data = data
    self._context = context
    self._seed = seed
    self._global_batch_size = global_batch_size
    self._iterator = None

  def make_iterator(self, loops: Loops) -> Iterator[Any]:
    """The iterator from the first loop's first step on."""
    with tf.device('/cpu:0'):
      self._iterator = iter(self._data.dataset(
          self._context, global_batch_size=self._global_batch_size,
          seed=self._seed, first_step=loops.start))
    return self._iterator


def _next_per_replica(strategy: tf.distribute.Strategy, iterator,
                      num_local_replicas: int) -> Any:
  """The iterator's next element for each of this worker's replicas, in
  order, as `distribute_datasets_from_function` hands them out: the element
  itself for one replica, else a distributed value."""
  elements = [next(iterator) for _ in range(num_local_replicas)]
  if num_local_replicas == 1:
    return elements[0]
  return strategy.experimental_distribute_values_from_function(
      lambda context: elements[
          context.replica_id_in_sync_group % num_local_replicas])


def steps_per_epoch_of(dataset: tf.data.Dataset, configured: int,
                       local_replicas: int = 1) -> int:
  """config.steps_per_epoch, or else one pass of a finite dataset, whose
  elements a step takes local_replicas at a time.

  Raises:
    ConfigError: for an endless or unknown-length dataset without
      config.steps_per_epoch.
  """
  if configured:
    return configured
  cardinality = int(dataset.cardinality())
  if cardinality >= local_replicas:
    return cardinality // local_replicas
  kind = ('endless' if cardinality == tf.data.INFINITE_CARDINALITY
          else 'of unknown length')
  raise errors.ConfigError(
      f'The task\'s training dataset is {kind}, so ctl cannot tell how many '
      'steps an epoch has: set config.steps_per_epoch.')


def input_context(strategy: tf.distribute.Strategy, worker_index: int,
                  num_workers: int) -> tf.distribute.InputContext:
  """This worker's InputContext: one input pipeline per worker."""
  return tf.distribute.InputContext(
      num_input_pipelines=num_workers, input_pipeline_id=worker_index,
      num_replicas_in_sync=strategy.num_replicas_in_sync)


def train_input(strategy: tf.distribute.Strategy, train_data, *, seed: int,
                length, pad_loops_to: int | None, num_local_replicas: int,
                context: tf.distribute.InputContext) -> TrainInput:
  """The step loop's view of a task's training data (see above); length:
  the run's TrainingLength; context: this worker's input context."""
  if isinstance(train_data, in_memory.InMemory):
    return InMemoryInput(
        strategy, train_data, context=context, seed=seed,
        global_batch_size=length.global_batch_size,
        steps_per_epoch=length.steps_per_epoch,
        num_local_replicas=num_local_replicas, pad_loops_to=pad_loops_to)
  if is_global_batches(train_data):
    return GlobalOrderInput(
        strategy, train_data, context=context, seed=seed,
        global_batch_size=length.global_batch_size,
        num_local_replicas=num_local_replicas)
  return DatasetInput(strategy, train_data, num_local_replicas)


def is_global_batches(data: Any) -> bool:
  """Whether data is a GlobalBatches, told without importing its module: a
  run whose task reads no files loads no file-reading code."""
  module = sys.modules.get('ctl.data.global_batches')
  return module is not None and isinstance(data, module.GlobalBatches)
