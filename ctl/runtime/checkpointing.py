"""Saves and restores the training state; only the chief writes to the workdir.

Under MultiWorkerMirroredStrategy every worker must take part in a save
(saving can run collectives). The chief writes `workdir/checkpoints`; every
other worker writes to a temporary directory of its own, outside the
workdir, and deletes it right after.

A save is crash-safe: tf.train.CheckpointManager writes the new
checkpoint's files completely before it atomically rewrites the
`checkpoint` state file that names the latest one, and deletes old
checkpoints only after that. A kill at any moment leaves the previous or the
new checkpoint as the latest, whole.
"""

from collections.abc import Callable
import os
import shutil
import tempfile

from absl import logging
import keras
import tensorflow as tf

from ctl import errors
from ctl.runtime import tf_internals


class Checkpointer:
  """A tf.train.CheckpointManager for the chief and a scratch one for others.

  With `async_save`, the chief writes files on a background thread: a save
  then costs training only the copy of the variables (1.8 ms instead of 19
  ms for a small MLP, 42 ms for the tutorials' CNN, BENCHMARKS.md). Other
  workers always save synchronously: their scratch copy is deleted at once.
  Every checkpoint's number is its step.
  Call `wait()` before the process ends.
  """

  def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, *,
               is_chief: bool, task_id: int, max_to_keep: int,
               async_save: bool = False,
               data_problem: Callable[[int], str | None] = lambda step: None):
    """Args as named; data_problem(step): why the parts of checkpoint
    `step` that every worker writes (its data position) cannot resume this
    job, or None when they can: only then can it be the latest."""
    self._checkpoint = checkpoint
    self._data_problem = data_problem
    self.directory = directory
    self._last_saved_step = None
    self._options = None
    if async_save and is_chief:
      # Needs tf_internals.fix_keras_async_checkpoint_copy (applied at
      # start-up) for Keras 3 variables.
      self._options = tf.train.CheckpointOptions(enable_async=True)
    _check_state_file(directory)
    # Every worker reads the chief's checkpoints; creating a manager writes
    # nothing.
    self._read_manager = tf.train.CheckpointManager(
        checkpoint, directory, max_to_keep=max_to_keep)
    if is_chief:
      self._write_manager = self._read_manager
      self._scratch_directory = None
    else:
      self._scratch_directory = os.path.join(
          tempfile.gettempdir(), f'ctl-workertemp_{task_id}-{os.getpid()}')
      self._write_manager = tf.train.CheckpointManager(
          checkpoint, self._scratch_directory, max_to_keep=1)

  @property
  def latest(self) -> str | None:
    """The newest whole checkpoint in the workdir; None when it has none.

    A checkpoint named by the state file but without files was moved away
    on purpose (a damaged one, as restore_latest's message suggests); one
    without every worker's data position was cut short by a kill while
    the workers saved. Either way the one before it is used, with a
    warning naming the reason.

    Raises:
      ConfigError: the checkpoints' data positions were saved by another
        number of input pipelines (workers).
      CtlError: there are checkpoints, but none can resume: training from
        step 0 would overwrite them.
    """
    listed = self._read_manager.checkpoints
    passed_over = []
    for path in reversed(listed):
      reason = self._problem(path)
      if reason is None:
        if passed_over:
          logging.warning('Resuming from %s.', path)
        return path
      logging.warning('Checkpoint %s %s: not resuming from it.', path, reason)
      passed_over.append(f'{path} {reason}')
    if passed_over:
      raise errors.CtlError(
          f'No checkpoint in {self.directory} can resume this run, and '
          'training from step 0 would overwrite them:\n  ' +
          '\n  '.join(passed_over) + '\nNothing was written. Restore the '
          'missing files, or train in a new --workdir (config.init_from='
          f'{self.directory!r} starts it from their weights).')
    return None

  def _problem(self, path: str) -> str | None:
    """Why checkpoint `path` cannot be resumed from; None if it can."""
    if not tf.io.gfile.exists(f'{path}.index'):
      return 'has no files (moved away?)'
    return self._data_problem(step_of(path))

  def restore_latest(self) -> str | None:
    """Restores the newest checkpoint, if any; returns its path.

    Raises:
      CtlError: when the checkpoint does not match the objects being
        restored (another model, optimizer or shape) or cannot be read. The
        checkpoint files are left as they were; the message names an
        earlier checkpoint that restores, if there is one.
    """
    path = self.latest
    if path is None:
      return None
    try:
      self._checkpoint.restore(path).assert_consumed()
    except Exception as error:  # pylint: disable=broad-except
      # Mismatches raise AssertionError or ValueError; damaged files raise
      # OpErrors, but a truncated one IndexError.
      raise errors.CtlError(
          f'Checkpoint {path} does not match this model and optimizer, or '
          f'cannot be read: {summary(error)}\nIt was left untouched. '
          f'{self._how_to_resume_before(path)}Resume it with the config that '
          'wrote it, or train in a new --workdir.') from error
    self._last_saved_step = step_of(path)
    logging.info('Restored %s', path)
    return path

  def _how_to_resume_before(self, failed: str) -> str:
    """Says how to resume from the newest earlier checkpoint that restores.

    Only called on the way to an error: restoring into the live objects to
    check is harmless then.
    """
    listed = self._read_manager.checkpoints
    for path in reversed(listed[:listed.index(failed)]):
      try:
        self._checkpoint.restore(path).assert_consumed()
      except Exception:  # pylint: disable=broad-except
        continue
      return (f'The previous checkpoint, {path}, restores correctly: to '
              f'resume from it, move {failed}.* out of {self.directory} '
              '(e.g. into a new directory) and run the same command again. ')
    return (f'No earlier checkpoint in {self.directory} restores into this '
            'task (config.intervals.keep_checkpoints keeps the last ones). ')

  def save(self, step: int) -> None:
    """Saves the state as checkpoint number `step` (on every worker).

    A step already saved (or just restored) is not saved again.
    """
    if step == self._last_saved_step:
      return
    path = self._write_manager.save(checkpoint_number=step,
                                    options=self._options)
    self._last_saved_step = step
    if self._scratch_directory is None:
      logging.info('Saved %s', path)
    else:
      shutil.rmtree(self._scratch_directory, ignore_errors=True)
      logging.info('Took part in saving checkpoint %d (the chief writes it)',
                   step)

  def write_copy(self, prefix: str | None) -> None:
    """Writes the state now, outside the rotation, at `prefix` (the chief;
    every other worker takes part through its scratch directory).

    The chief's write is asynchronous as its saves are: `wait()` returns
    once its files are complete.
    """
    if self._scratch_directory is None:
      self._checkpoint.write(prefix, options=self._options)
    else:
      self._checkpoint.write(os.path.join(self._scratch_directory, 'copy'))
      shutil.rmtree(self._scratch_directory, ignore_errors=True)

  def wait(self) -> None:
    """Returns once every checkpoint saved so far is completely written."""
    if self._options is not None:
      self._checkpoint.sync()


def step_of(path: str) -> int:
  """The step of a checkpoint path: every checkpoint is named ckpt-<step>."""
  return int(path.rsplit('-', 1)[1])


def _check_state_file(directory: str) -> None:
  """Fails if the state file naming the checkpoints exists but is unreadable.

  tf.train.CheckpointManager would log a warning and start from scratch,
  overwriting the checkpoints. (A missing state file only means that the
  first save never completed: it is written last, atomically.)
  """
  state_file = os.path.join(directory, 'checkpoint')
  if not tf.io.gfile.exists(state_file):
    return
  try:
    readable = tf.train.get_checkpoint_state(directory) is not None
  except ValueError:  # Parsed, but names no checkpoint.
    readable = False
  if not readable:
    raise errors.CtlError(
        f'The checkpoint state file {state_file} cannot be read, so the '
        'latest checkpoint is unknown. It and the checkpoints were left '
        'untouched: repair or remove it, or train in a new --workdir.')


def warm_start(models: dict[str, keras.Model], source: str) -> str:
  """Loads model weights (nothing else) from a checkpoint or a workdir.

  Args:
    models: the task's freshly built Keras models by attribute name, as the
      source's task named them.
    source: a checkpoint path prefix, a checkpoint directory, or a workdir.

  Returns:
    The checkpoint path read.

  Raises:
    CtlError: when no checkpoint is found or it does not fit the models.
  """
  path = source
  for directory in (source, os.path.join(source, 'checkpoints')):
    if tf.io.gfile.isdir(directory) and tf.train.latest_checkpoint(directory):
      path = tf.train.latest_checkpoint(directory)
      break
  holder = tf.Module()
  for name, model in models.items():
    setattr(holder, name, model)
  try:
    status = tf.train.Checkpoint(task=holder).read(path)
    status.expect_partial().assert_existing_objects_matched()
  except Exception as error:  # pylint: disable=broad-except
    raise errors.CtlError(
        f'Cannot warm-start from config.init_from={source!r}: '
        f'{summary(error)}') from error
  logging.info('Warm start: model weights from %s', path)
  return path


def summary(error: Exception, max_chars: int = 600) -> str:
  """The error's message, cut to one readable paragraph."""
  text = str(error).strip() or type(error).__name__
  return text if len(text) <= max_chars else text[:max_chars] + ' ...'


class DataPositions:
  """Each input pipeline's data position (its tf.data iterator), per step.

  The chief's checkpoint cannot hold the other workers' iterators, so every
  worker writes its own pipeline's, `<directory>/pipeline-<i>-of-<n>/
  ckpt-<step>`, before the checkpoint of the same step, and keeps as many
  as the checkpoints. The name says which shard of how many it is: a
  position saved by another number of workers is another shard, and a
  worker's name (chief or worker) does not matter.
  """

  def __init__(self, trackables: dict, directory: str, *, max_to_keep: int,
               pipeline: int = 0, num_pipelines: int = 1):
    """Args as named; pipeline: this worker's input pipeline (its worker
    index) of num_pipelines (the training workers)."""
    self._root = directory
    self._num_pipelines = num_pipelines
    self._checkpoint = tf.train.Checkpoint(**trackables)
    self._directory = os.path.join(directory,
                                   _pipeline_dir(pipeline, num_pipelines))
    self._max_to_keep = max_to_keep
    self.enabled = bool(trackables)

  def _prefix(self, step: int) -> str:
    return os.path.join(self._directory, f'ckpt-{step}')

  def problem(self, step: int) -> str | None:
    """Why the data positions of checkpoint `step` cannot resume this job's
    pipelines; None when every pipeline's is there.

    Raises:
      ConfigError: they were saved, whole, by another number of pipelines.
    """
    if not self.enabled:
      return None
    saved = self._saved_at(step)
    if len(saved.get(self._num_pipelines, ())) == self._num_pipelines:
      return None
    for count, pipelines in saved.items():
      if len(pipelines) == count:
        raise errors.ConfigError(
            f'The checkpoint of step {step} was saved by {count} worker(s), '
            f'and this job has {self._num_pipelines}: each worker reads its '
            'own shard of the task\'s tf.data pipeline and saved its own '
            'position in it, so the shards cannot resume on another number '
            f'of workers. Nothing was written. Resume with {count} '
            'worker(s), or train in a new --workdir starting from these '
            'weights with --config.init_from='
            f'{os.path.dirname(self._root)}')
    if saved:
      return ('lacks a worker\'s data position (a worker was killed while '
              'the workers saved it)')
    return (f'has no data position in {self._root} (a task that reads a '
            'tf.data pipeline saves one per worker beside every checkpoint)')

  def _saved_at(self, step: int) -> dict[int, set[int]]:
    """{number of pipelines: the pipelines with a position at `step`}."""
    saved = {}
    for index in tf.io.gfile.glob(os.path.join(
        self._root, 'pipeline-*-of-*', f'ckpt-{step}.index')):
      name = os.path.basename(os.path.dirname(index))
      _, pipeline, _, count = name.split('-')
      saved.setdefault(int(count), set()).add(int(pipeline))
    return saved

  def check_savable(self, dataset: tf.data.Dataset | None) -> None:
    """Fails now, before training, if the position of `dataset` (the
    pipeline the iterator reads) could not be saved: a stateful op anywhere
    in it fails the save once the iterator has reached it, before or after
    a shuffle.

    Raises:
      CtlError: naming the op that makes the pipeline's state unsavable.
    """
    if not self.enabled or dataset is None:
      return
    try:
      tf_internals.check_dataset_serializable(dataset)
    except tf.errors.FailedPreconditionError as error:
      raise _unsavable(error) from error
    hazard = tf_internals.symbolic_checkpoint_hazard(dataset)
    if hazard is not None:  # Its saves could segfault (tf_internals).
      raise errors.CtlError(hazard)

  def save(self, step: int) -> None:
    """Writes this pipeline's position at `step`; drops the oldest.

    Raises:
      CtlError: when the position cannot be saved (then no checkpoint of
        this step is written; the earlier ones stay).
    """
    if not self.enabled:
      return
    try:
      self._checkpoint.write(self._prefix(step))
    except tf.errors.FailedPreconditionError as error:
      raise _unsavable(error) from error
    steps = sorted(step_of(name.rsplit('.', 1)[0]) for name in
                   tf.io.gfile.listdir(self._directory)
                   if name.startswith('ckpt-') and name.endswith('.index'))
    for old in steps[:-self._max_to_keep]:
      for path in tf.io.gfile.glob(self._prefix(old) + '.*'):
        tf.io.gfile.remove(path)

  def restore(self, step: int) -> None:
    """Restores this pipeline's position at `step`.

    Raises:
      CtlError: when it is missing or does not fit the pipeline.
    """
    if not self.enabled:
      return
    prefix = self._prefix(step)
    if not tf.io.gfile.exists(prefix + '.index'):
      raise errors.CtlError(
          f'The data position of step {step} is missing ({prefix}): the '
          'checkpoint cannot resume the data exactly. Train in a new '
          '--workdir, or restore the file.')
    try:
      self._checkpoint.read(prefix).assert_consumed()
    except Exception as error:  # pylint: disable=broad-except
      raise errors.CtlError(
          f'The data position {prefix} does not fit this task\'s input '
          f'pipeline: {summary(error)}. Resume with the pipeline that wrote '
          'it, or train in a new --workdir.') from error


def _pipeline_dir(pipeline: int, num_pipelines: int) -> str:
  return f'pipeline-{pipeline}-of-{num_pipelines}'


def _unsavable(error: tf.errors.FailedPreconditionError) -> errors.CtlError:
  """The error for a pipeline whose position cannot be saved."""
  reason = error.message.strip().splitlines()[0]
  reason = reason.split('}}')[-1].split('[Op:')[0].strip()
  reason = reason.removeprefix('Failed to serialize the input pipeline '
                               'graph: ')
  return errors.CtlError(
      f'The training pipeline\'s position cannot be saved: {reason} (a '
      'stateful op in the tf.data pipeline, before or after a shuffle, such '
      'as tf.random.uniform, a Keras random layer, tf.py_function or '
      'Dataset.from_generator). ctl must save it to resume exactly: draw '
      'random numbers with stateless ops seeded by (seed, epoch, example), '
      'e.g. ctl.data.augment.seeds and tf.random.stateless_uniform. Nothing '
      'was saved at this step; earlier checkpoints are kept.')
