"""Saves and restores the training state; only the chief writes to the workdir.

Under MultiWorkerMirroredStrategy every worker must take part in a save
(saving can run collectives). The chief writes `workdir/checkpoints`; every
other worker writes to a temporary directory of its own, outside the
workdir, and deletes it right after (a killed worker's: the next run).

A save is crash-safe: tf.train.CheckpointManager writes the new
checkpoint's files completely before it atomically rewrites the
`checkpoint` state file that names the latest one, and deletes old
checkpoints only after that. A kill at any moment leaves the previous or the
new checkpoint as the latest, whole. The files are flushed to the disk
before the state file names them, and "Saved <path>" is logged only once
it does (Checkpointer.save).
"""

from collections.abc import Sequence
import dataclasses
import os

from absl import logging
import tensorflow as tf

from ctl import actions as actions_lib
from ctl import errors
from ctl import storage
from ctl.checkpoints import contents as checkpoint_contents
from ctl.checkpoints import data_positions
from ctl.checkpoints import files as checkpoint_files
from ctl.runtime import tf_internals
from ctl.runtime import workdir as workdir_lib


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
               data: data_positions.DataPositions | None = None):
    """Args as named; data: the data positions every worker writes beside
    each checkpoint: a checkpoint can be the latest only when they can
    resume this job (DataPositions.problem)."""
    self._checkpoint = checkpoint
    self._data = data
    self.directory = directory
    self._last_saved_step = None
    self._options = None
    if async_save and is_chief:
      # Needs tf_internals.fix_keras_async_checkpoint_copy (applied at
      # start-up) for Keras 3 variables.
      self._options = tf.train.CheckpointOptions(enable_async=True)
    checkpoint_files.check_state_file(directory)
    # Every worker reads the chief's checkpoints; creating a manager writes
    # nothing.
    self._read_manager = tf.train.CheckpointManager(
        checkpoint, directory, max_to_keep=max_to_keep)
    if is_chief:
      self._write_manager = self._read_manager
      self._scratch_directory = None
    else:
      self._scratch_directory = workdir_lib.scratch_path(
          f'workertemp_{task_id}')
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
    if not storage.exists(f'{path}.index'):
      return 'has no files (moved away?)'
    if self._data is None:
      return None
    return self._data.problem(checkpoint_files.step_of(path))

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
      checkpoint_contents.readable_part(self._checkpoint, path).restore(
          path).assert_consumed()
    except Exception as error:  # pylint: disable=broad-except
      # Mismatches raise AssertionError or ValueError; damaged files raise
      # OpErrors, but a truncated one IndexError.
      raise errors.CtlError(
          f'Checkpoint {path} does not match this model and optimizer, or '
          f'cannot be read: {errors.summary(error)}\nIt was left untouched. '
          f'{self._how_to_resume_before(path)}Resume it with the config that '
          'wrote it, or train in a new --workdir.') from error
    self._last_saved_step = checkpoint_files.step_of(path)
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
        checkpoint_contents.readable_part(self._checkpoint, path).restore(
            path).assert_consumed()
      except Exception:  # pylint: disable=broad-except
        continue
      return (f'The previous checkpoint, {path}, restores correctly: to '
              f'resume from it, move {failed}.* out of {self.directory} '
              '(e.g. into a new directory) and run the same command again. ')
    return (f'No earlier checkpoint in {self.directory} restores into this '
            'task (config.intervals.keep_checkpoints keeps the last ones). ')

  def save(self, step: int) -> None:
    """Saves the state as checkpoint number `step` (on every worker).

    A step already saved (or just restored) is not saved again. The
    chief logs "Saved <path>" once the checkpoint is durable: its files
    written and flushed to the disk, then the state file naming it (a
    background write's, later, from its thread).
    """
    if step == self._last_saved_step:
      return
    if self._scratch_directory is None:
      self._write_manager.save(checkpoint_number=step,
                               options=self._durable_save_options())
    else:
      self._write_manager.save(checkpoint_number=step)
      storage.remove(self._scratch_directory)
      logging.info('Took part in saving checkpoint %d (the chief writes it)',
                   step)
    self._last_saved_step = step

  def _durable_save_options(self) -> tf.train.CheckpointOptions:
    """Options of a chief's save whose write callbacks make it durable and
    then log it.

    TensorFlow runs a save's write callbacks in their list's order, once
    its files are written (on the write's thread, when asynchronous);
    CheckpointManager.save appends to the list (of a copy of the options:
    SharedList keeps it the same list) the callback that writes the state
    file. So the first callback flushes the files and appends the last
    one, which runs after the state file is written.
    """
    callbacks = checkpoint_files.SharedList()

    def files_written(path: str) -> None:
      checkpoint_files.make_durable(path)
      callbacks.append(state_written)

    def state_written(path: str) -> None:
      storage.sync([os.path.join(self.directory, 'checkpoint'),
                    self.directory])
      logging.info('Saved %s', path)

    callbacks.append(files_written)
    return tf.train.CheckpointOptions(
        enable_async=self._options is not None,
        experimental_write_callbacks=callbacks)

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
      storage.remove(self._scratch_directory)

  def remove_leftovers(self) -> None:
    """Removes the ckpt-<step>_temp folders in which TensorFlow wrote the
    parts of checkpoints that a kill or a failed write cut short (the
    chief, before training: no save is under way)."""
    for path in storage.glob(os.path.join(self.directory, 'ckpt-*_temp')):
      logging.info('Removing %s, left by a checkpoint write that was cut '
                   'short.', path)
      storage.remove(path)

  def wait(self, last: bool = False) -> None:
    """Returns once every checkpoint saved so far is completely written;
    `last`: and ends the background writes' thread (the run is over).
    Raises the error of a background write that failed (OpError, OSError),
    which TensorFlow would raise only at the next write, or at exit."""
    if self._options is not None:
      self._checkpoint.sync()
      error = tf_internals.take_async_checkpoint_error(self._checkpoint)
      if last:
        tf_internals.end_async_checkpoint_thread(self._checkpoint)
      if error is not None:
        raise error



@dataclasses.dataclass(frozen=True)
class Restored:
  """What restore_latest restored: the step, and why an action stopped
  training there (None when none did)."""

  step: int
  stopped: str | None


class TrainingCheckpoint(actions_lib.Action):
  """A run's whole checkpoint: the model's (a Checkpointer), every
  worker's data position and the actions' states, saved and restored
  together. It is the loop's last action, due by its intervals, at the
  end and on request: it holds every decision of its step.
  """

  name = 'checkpoint'
  on_every_worker = True

  def __init__(self, checkpointer: Checkpointer,
               data: data_positions.DataPositions | None,
               states: actions_lib.ActionStates, *, task, state,
               when: actions_lib.When, workdir: str,
               workdir_lock: workdir_lib.Lock):
    """Args as named.

    Args:
      checkpointer: the checkpoint of the task's variables and `state`.
      data: this worker's data positions; None: its input has none.
      states: the variable in its checkpoint holding the actions'.
      task: the ctl.Task whose weights restore_weights puts back.
      state: the TrainState (step, epoch), checked on restore.
      workdir_lock: the lock of `workdir`; a save into a workdir that
        vanished (the lock lost) fails.
    """
    self.checkpointer, self.data, self._states = checkpointer, data, states
    self._actions = []  # Those whose states it saves (track).
    self._task, self._state = task, state
    self.when = when
    self._workdir, self._workdir_lock = workdir, workdir_lock

  def restore_latest(self, steps_per_epoch: int) -> Restored | None:
    """Restores the latest checkpoint, its data position and the actions'
    states; None when there is none.

    Raises:
      ConfigError: it cuts epochs other than `steps_per_epoch` does.
      CtlError: it, or its data position, does not fit (see Checkpointer
        and DataPositions): nothing was written.
    """
    if not self.checkpointer.restore_latest():
      return None
    self._state.check_resumable(steps_per_epoch)
    step = int(self._state.step.numpy())
    if self.data:
      self.data.restore(step)
    return Restored(step, self._states.restore(self._actions))

  def track(self, actions: Sequence[actions_lib.Action]) -> None:
    """Saves the states of `actions` too, from now on, and gives them those
    of the checkpoint restored, if any (kept until the next save)."""
    self._states.restore(actions)
    self._actions.extend(actions)

  def run(self, event: actions_lib.Event) -> None:
    """As an action: saves at the event's step."""
    self.save(event.step, event.requests.get('stop'))

  def save(self, step: int, stopped: str | None = None) -> None:
    """Saves checkpoint `step` on every worker: the actions' states (and
    why training stops there, if it does), the data position, the model."""
    self.check_workdir()
    self._states.capture(self._actions, stopped)
    if self.data:
      self.data.save(step)
    self.checkpointer.save(step)

  def restore_weights(self) -> int:
    """Puts back the task's variables from the latest checkpoint, not the
    step or the data position (a rollback); returns its step."""
    self.checkpointer.wait()
    path = self.checkpointer.latest
    if path is None:
      raise errors.CtlError(
          'The training loss diverged before the first checkpoint: there is '
          'nothing to roll back to. Lower the learning rate, or save '
          'earlier (config.intervals.checkpoint_steps).')
    checkpoint_contents.weights_checkpoint(self._task).read(
        path).expect_partial()
    return checkpoint_files.step_of(path)

  def check_workdir(self) -> None:
    """Stops the run if the workdir vanished (the chief, which holds its
    lock): TensorFlow would write the next checkpoint into folders created
    anew, and the run would go on.

    Raises:
      CtlError: it was deleted, moved or replaced.
    """
    if self._workdir_lock.lost():
      raise workdir_lib.vanished(
          self._workdir, 'the folder this run locked is no longer there')
