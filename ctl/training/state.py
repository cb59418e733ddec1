"""The training state: where training is (the step counters), what a
checkpoint holds, and how long training lasts."""

import dataclasses
import hashlib

from absl import logging
import ml_collections
import numpy as np
import tensorflow as tf

from ctl import config_checks
from ctl import errors
from ctl import task as task_lib


class TrainState:
  """The position of training, saved in every checkpoint.

  `step` counts finished global steps and decides the data position of
  in-memory data; `epoch` and `step_in_epoch` are kept beside it so that a
  checkpoint says where in the data it stopped, and a resume can check that
  the config still cuts epochs the same way.
  """

  def __init__(self):
    """Creates the counters; call inside `strategy.scope()`."""
    self.step = self._counter('step')
    self.epoch = self._counter('epoch')
    self.step_in_epoch = self._counter('step_in_epoch')
    # How many workers trained up to the checkpoint (0: not recorded).
    self.num_workers = self._counter('num_workers')
    # The partitions of files in the global order (0: other data, or a
    # checkpoint of ctl before 0.2.0, whose order is the one of 1 partition).
    self.data_partitions = self._counter('data_partitions')

  @staticmethod
  def _counter(name: str) -> tf.Variable:
    return tf.Variable(0, dtype=tf.int64, trainable=False, name=name,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  def advance(self, num_steps: tf.Tensor, steps_per_epoch: int) -> None:
    """Moves the counters num_steps steps on."""
    step = self.step.assign_add(tf.cast(num_steps, tf.int64))
    self.epoch.assign(step // steps_per_epoch)
    self.step_in_epoch.assign(step % steps_per_epoch)

  def as_dict(self) -> dict[str, int]:
    return {'step': int(self.step.numpy()), 'epoch': int(self.epoch.numpy()),
            'step_in_epoch': int(self.step_in_epoch.numpy())}

  def checkpointable(self) -> dict[str, tf.Variable]:
    return {'step': self.step, 'epoch': self.epoch,
            'step_in_epoch': self.step_in_epoch,
            'num_workers': self.num_workers,
            'data_partitions': self.data_partitions}

  def check_resumable(self, steps_per_epoch: int) -> None:
    """Fails if the config cuts epochs differently from the checkpoint's."""
    position = self.as_dict()
    expected = divmod(position['step'], steps_per_epoch)
    if (position['epoch'], position['step_in_epoch']) != expected:
      raise errors.ConfigError(
          f"The checkpoint stopped at step {position['step']}, epoch "
          f"{position['epoch']} step {position['step_in_epoch']} of its "
          f'epoch, but this config has {steps_per_epoch} steps per epoch, so '
          'the data would not resume where it stopped. Resume with the '
          'config that wrote the checkpoint (batch_size, steps_per_epoch, '
          'data), or train in a new --workdir.')


@dataclasses.dataclass(frozen=True)
class TrainingLength:
  """Batch sizes and step counts, resolved from the config and the data."""

  global_batch_size: int
  eval_batch_size: int
  steps_per_epoch: int
  total_steps: int

  @property
  def num_epochs(self) -> int:
    return -(-self.total_steps // self.steps_per_epoch)


def note_workers(state: TrainState, num_workers: int,
                 data_kind: str) -> None:
  """Logs a resume on another number of workers than the checkpoint's
  (data_kind: what keeps the data order, e.g. 'in-memory data'), and
  records this job's number for the next checkpoint."""
  written_by = int(state.num_workers.numpy())
  if written_by and written_by != num_workers:
    logging.info('Resumed on %d worker(s); the checkpoint was written by %d; '
                 'same data order (%s: the position is the step).',
                 num_workers, written_by, data_kind)
  state.num_workers.assign(num_workers)


def note_partitions(state: TrainState, partitions: int | None,
                    checkpoints: str) -> None:
  """Checks that a resumed checkpoint read files in the global order in
  as many partitions as this job (partitions; None: other data), and
  records them for the next checkpoint; checkpoints: the directory, for
  the message.

  Raises:
    ConfigError: another number, which would give other global batches.
  """
  recorded = int(state.data_partitions.numpy())
  step = int(state.step.numpy())
  if partitions and step and recorded != partitions and (recorded or
                                                          partitions != 1):
    written = (f'was written by ctl before 0.2.0, whose global order of '
               'the files is this one with 1 partition (every worker read '
               'every record)' if not recorded else
               f'read the files in {recorded} partitions')
    raise errors.ConfigError(
        f'The checkpoint of step {step} {written}, and this job reads them '
        f'in {partitions}: the global batches would differ. Nothing was '
        f'written. Resume with partitions={recorded or 1} '
        '(config.data.tfrecord.partitions or config.data.tfds.partitions, '
        'or global_batches(partitions=...) in a task of your own)'
        f'{" on 1 worker" if not recorded else ""}, or train in a new '
        '--workdir starting from these weights with --config.init_from='
        f'{checkpoints}')
  state.data_partitions.assign(partitions or 0)


def check_batch_sizes(config: ml_collections.ConfigDict,
                      num_replicas: int) -> None:
  """Raises ConfigError if a batch does not divide across the replicas (a
  training batch: into accumulate_steps micro-batches on each)."""
  accumulate = config.get('accumulate_steps', 1)
  for key, batch_size, parts in (
      ('batch_size', config.batch_size, num_replicas * accumulate),
      ('eval_batch_size', config.eval_batch_size or config.batch_size,
       num_replicas)):
    if batch_size % parts:
      into = (f'{num_replicas} replica(s) x config.accumulate_steps='
              f'{accumulate} micro-batches' if parts != num_replicas else
              f'{num_replicas} replicas of this job')
      fits = [count for count in range(1, batch_size + 1)
              if batch_size % (count * parts // num_replicas) == 0]
      replicas = (f', or (to resume a run with this batch) a number of '
                  f'replicas that divides it: {_first(fits)}' if fits else '')
      micro = ''
      if parts != num_replicas:
        steps = [count for count in range(1, batch_size + 1)
                 if batch_size % (count * num_replicas) == 0]
        micro = f', or config.accumulate_steps in {_first(steps)}'
      raise errors.ConfigError(
          f'config.{key}={batch_size} does not divide across the {into}: '
          f'use a multiple of {parts}{replicas}{micro}.')


def _first(counts: list[int]) -> str:
  return ', '.join(map(str, counts[:12])) + (', ...' if len(counts) > 12
                                             else '')


def training_length(config: ml_collections.ConfigDict,
                    steps_per_epoch: int) -> TrainingLength:
  """Resolves the 0-means-default fields, given the data's epoch length.

  Raises:
    ConfigError: the run's steps or examples do not fit in int64.
  """
  config_checks.check_run_length(config, steps_per_epoch)
  total_steps = config.total_steps or config.num_epochs * steps_per_epoch
  return TrainingLength(config.batch_size,
                        config.eval_batch_size or config.batch_size,
                        steps_per_epoch, total_steps)


def in_memory_steps_per_epoch(config: ml_collections.ConfigDict,
                              num_examples: int) -> int:
  """config.steps_per_epoch, or one pass over in-memory examples."""
  steps_per_epoch = config.steps_per_epoch or num_examples // config.batch_size
  if not steps_per_epoch:
    raise errors.ConfigError(
        f'config.batch_size={config.batch_size} is larger than the '
        f'{num_examples} training examples.')
  return steps_per_epoch


def check_workers_agree(strategy: tf.distribute.Strategy,
                         state: TrainState) -> None:
  """Fails if workers restored different steps (each must see the workdir)."""
  @tf.function(autograph=False)
  def mean_step():
    return strategy.reduce(
        tf.distribute.ReduceOp.MEAN,
        strategy.run(lambda: tf.cast(state.step, tf.float64)), axis=None)

  local, mean = float(state.step.numpy()), float(mean_step())
  if mean != local:
    raise errors.CtlError(
        f'This worker restored step {int(local)} but the workers average '
        f'{mean}: every worker must read the same workdir (a shared '
        'filesystem) to resume.')


def weights_fingerprint(task: task_lib.Task) -> str:
  """A SHA-256 of every model weight's bytes: equal only for identical
  weights."""
  digest = hashlib.sha256()
  for model in task.models():
    for weight in model.weights:
      digest.update(np.ascontiguousarray(weight.numpy()).tobytes())
  return digest.hexdigest()
