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
               is_whole: Callable[[int], bool] = lambda step: True):
    """Args as named; is_whole(step): whether the parts of checkpoint
    `step` that others write (each worker's data position) are all there:
    only then can it be the latest."""
    self._checkpoint = checkpoint
    self._is_whole = is_whole
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
    """The newest whole checkpoint in the workdir, if any.

    A checkpoint named by the state file but without files was moved away
    on purpose (a damaged one, as restore_latest's message suggests); one
    without every worker's data position was cut short by a kill while
    the workers saved. Either way the one before it is used, with a
    warning.
    """
    listed = self._read_manager.checkpoints
    for path in reversed(listed):
      if not tf.io.gfile.exists(f'{path}.index'):
        logging.warning('Checkpoint %s has no files (moved away?): not '
                        'resuming from it.', path)
      elif not self._is_whole(step_of(path)):
        logging.warning('Checkpoint %s lacks a worker\'s data position (a '
                        'worker was killed while saving it): not resuming '
                        'from it.', path)
      else:
        if path != listed[-1]:
          logging.warning('Resuming from %s.', path)
        return path
    return None

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
    return ''

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
  """Each worker's data position (its tf.data iterator), saved per step.

  The chief's checkpoint cannot hold the other workers' iterators, so every
  worker writes its own, `<directory>/<worker>/ckpt-<step>`, before the
  checkpoint of the same step, and keeps as many as the checkpoints.
  """

  def __init__(self, trackables: dict, directory: str, worker: str,
               max_to_keep: int, num_workers: int = 1,
               all_workers: tuple[str, ...] = ()):
    """Args as named; num_workers: the workers sharing the data now (a
    position saved by another number of workers is another shard);
    all_workers: every training worker's name, this one's included (default:
    this one alone)."""
    self._num_workers = num_workers
    self._root = directory
    self._all_workers = all_workers or (worker,)
    self._saved_num_workers = tf.Variable(num_workers, dtype=tf.int64,
                                          trainable=False)
    self._checkpoint = tf.train.Checkpoint(
        num_workers=self._saved_num_workers, **trackables)
    self._directory = os.path.join(directory, worker)
    self._max_to_keep = max_to_keep
    self.enabled = bool(trackables)

  def _prefix(self, step: int) -> str:
    return os.path.join(self._directory, f'ckpt-{step}')

  def is_whole(self, step: int) -> bool:
    """Whether every worker's position at `step` was written (each worker
    writes its own before the checkpoint; a kill can cut that short)."""
    return not self.enabled or all(
        tf.io.gfile.exists(os.path.join(self._root, worker,
                                        f'ckpt-{step}.index'))
        for worker in self._all_workers)

  def check_savable(self) -> None:
    """Saves the position once to scratch, so that a pipeline whose state
    cannot be saved fails before training, not at the first checkpoint.

    Raises:
      CtlError: naming the op that makes the pipeline's state unsavable.
    """
    if not self.enabled:
      return
    scratch = tempfile.mkdtemp(prefix='ctl-data-check-')
    try:
      self._checkpoint.write(os.path.join(scratch, 'check'))
    except tf.errors.FailedPreconditionError as error:
      reason = error.message.strip().splitlines()[0]
      reason = reason.split('}}')[-1].split('[Op:')[0].strip()
      raise errors.CtlError(
          f'The training pipeline\'s position cannot be saved: {reason} '
          '(a stateful op in the tf.data pipeline, such as tf.random.uniform, '
          'a Keras random layer or tf.py_function in map). ctl must save it '
          'to resume exactly: draw random numbers with stateless ops seeded '
          'by (seed, epoch, example), e.g. ctl.data.augment.seeds and '
          'tf.random.stateless_uniform.') from error
    finally:
      shutil.rmtree(scratch, ignore_errors=True)

  def save(self, step: int) -> None:
    if not self.enabled:
      return
    self._checkpoint.write(self._prefix(step))
    steps = sorted(int(name.split('-')[1].split('.')[0]) for name in
                   tf.io.gfile.listdir(self._directory)
                   if name.startswith('ckpt-') and name.endswith('.index'))
    for old in steps[:-self._max_to_keep]:
      for path in tf.io.gfile.glob(self._prefix(old) + '.*'):
        tf.io.gfile.remove(path)

  def restore(self, step: int) -> None:
    """Restores this worker's position at `step`.

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
    saved = int(self._saved_num_workers.numpy())
    if saved != self._num_workers:
      raise errors.CtlError(
          f'The data positions of step {step} were saved by {saved} '
          f'worker(s), and this job has {self._num_workers}: each worker '
          'reads its own shard of the data, so the shards would not resume '
          f'where they stopped. Resume with {saved} worker(s), or train in a '
          'new --workdir (config.init_from can start it from these '
          'weights).')
    self._saved_num_workers.assign(self._num_workers)
