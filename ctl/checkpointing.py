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

import os
import shutil
import tempfile

from absl import logging
import keras
import tensorflow as tf

from ctl import errors
from ctl import steps as steps_lib


def training_checkpoint(model: keras.Model,
                        optimizer: keras.optimizers.Optimizer,
                        state: steps_lib.TrainState) -> tf.train.Checkpoint:
  """Everything a run needs to continue exactly where it stopped.

  Keras 3 keeps the state of random layers (Dropout's seed generator) in
  variables that tf.train.Checkpoint does not find through the model; they
  are added explicitly so that a resumed run draws the same random numbers.
  """
  weights = {id(weight) for weight in model.weights}
  rng_states = [v for v in model.variables if id(v) not in weights]
  return tf.train.Checkpoint(model=model, optimizer=optimizer, rng=rng_states,
                             step=state.step, epoch=state.epoch,
                             step_in_epoch=state.step_in_epoch)


class Checkpointer:
  """A tf.train.CheckpointManager for the chief and a scratch one for others.

  With `async_save`, the chief writes files on a background thread: a save
  then costs training only the copy of the variables (1.8 ms instead of 19
  ms for a small MLP, 42 ms for the tutorials' CNN, BENCHMARKS.md). Other
  workers always save synchronously: their scratch copy is deleted at once.
  Call `wait()` before the process ends.
  """

  def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, *,
               is_chief: bool, task_id: int, max_to_keep: int,
               async_save: bool = False):
    self._checkpoint = checkpoint
    self.directory = directory
    self._last_saved_step = None
    self._options = None
    if async_save and is_chief:
      _fix_keras_async_checkpoint_copy()
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
    """The newest checkpoint in the workdir whose files exist, if any.

    A checkpoint named by the state file but without files was moved away
    on purpose (a damaged one, as restore_latest's message suggests): the
    one before it is used, with a warning.
    """
    listed = self._read_manager.checkpoints
    for path in reversed(listed):
      if tf.io.gfile.exists(f'{path}.index'):
        if path != listed[-1]:
          logging.warning('The latest checkpoint %s has no files (moved '
                          'away?); resuming from %s.', listed[-1], path)
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
          f'cannot be read: {_summary(error)}\nIt was left untouched. '
          f'{self._how_to_resume_before(path)}Resume it with the config that '
          'wrote it, or train in a new --workdir.') from error
    self._last_saved_step = int(path.rsplit('-', 1)[1])  # ckpt-<step>
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

  def wait(self) -> None:
    """Returns once every checkpoint saved so far is completely written."""
    if self._options is not None:
      self._checkpoint.sync()


def _fix_keras_async_checkpoint_copy() -> None:
  """Lets TensorFlow's async checkpointing copy Keras 3 variables.

  keras.src.backend.tensorflow.core.Variable._copy_trackable_to_cpu creates a
  new tf.Variable on every save, which the tf.function doing the copy
  refuses from the second save on ("tf.function only supports singleton
  tf.Variables created on the first call"; Keras 3.15). The CPU copy that
  TensorFlow already makes of the wrapped tf.Variable serves as the Keras
  variable's copy: both save the same tensors. Idempotent.
  """
  from keras.src.backend.tensorflow import core as keras_tf_core  # pylint: disable=g-import-not-at-top
  variable_class = keras_tf_core.Variable
  if getattr(variable_class._copy_trackable_to_cpu, 'ctl_fixed', False):  # pylint: disable=protected-access
    return

  def copy_trackable_to_cpu(self, object_map):
    self.value._copy_trackable_to_cpu(object_map)  # pylint: disable=protected-access
    object_map[self] = object_map[self.value]

  copy_trackable_to_cpu.ctl_fixed = True
  variable_class._copy_trackable_to_cpu = copy_trackable_to_cpu  # pylint: disable=protected-access


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


def warm_start(model: keras.Model, source: str) -> str:
  """Loads model weights (nothing else) from a checkpoint or a workdir.

  Args:
    model: the freshly built model.
    source: a checkpoint path prefix, a checkpoint directory, or a workdir.

  Returns:
    The checkpoint path read.

  Raises:
    CtlError: when no checkpoint is found or it does not fit the model.
  """
  path = source
  for directory in (source, os.path.join(source, 'checkpoints')):
    if tf.io.gfile.isdir(directory) and tf.train.latest_checkpoint(directory):
      path = tf.train.latest_checkpoint(directory)
      break
  try:
    status = tf.train.Checkpoint(model=model).read(path)
    status.expect_partial().assert_existing_objects_matched()
  except Exception as error:  # pylint: disable=broad-except
    raise errors.CtlError(
        f'Cannot warm-start from config.init_from={source!r}: '
        f'{_summary(error)}') from error
  logging.info('Warm start: model weights from %s', path)
  return path


def _summary(error: Exception, max_chars: int = 600) -> str:
  text = str(error).strip() or type(error).__name__
  return text if len(text) <= max_chars else text[:max_chars] + ' ...'
