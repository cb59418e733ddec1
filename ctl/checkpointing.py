"""Saves and restores the training state; only the chief writes to the workdir.

Under MultiWorkerMirroredStrategy every worker must take part in a save
(saving can run collectives). The chief writes `workdir/checkpoints`; every
other worker writes to a temporary directory of its own, outside the
workdir, and deletes it right after.
"""

import os
import shutil
import tempfile

from absl import logging
import tensorflow as tf

from ctl import errors


class Checkpointer:
  """A tf.train.CheckpointManager for the chief and a scratch one for others."""

  def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, *,
               is_chief: bool, task_id: int, max_to_keep: int):
    self._checkpoint = checkpoint
    self.directory = directory
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
    """The path of the newest checkpoint in the workdir, if any."""
    return self._read_manager.latest_checkpoint

  def restore_latest(self) -> str | None:
    """Restores the newest checkpoint, if any; returns its path.

    Raises:
      CtlError: when the checkpoint does not match the objects being
        restored (another model, optimizer or shape) or cannot be read. The
        checkpoint files are left as they were.
    """
    path = self.latest
    if path is None:
      return None
    try:
      self._checkpoint.restore(path).assert_consumed()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
      raise errors.CtlError(
          f'Checkpoint {path} does not match this model and optimizer, or '
          f'cannot be read: {_first_line(error)}\nIt was left untouched. '
          'Resume it with the config that wrote it, or train in a new '
          '--workdir.') from error
    logging.info('Restored %s', path)
    return path

  def save(self, step: int) -> None:
    """Saves the state as checkpoint number `step` (on every worker)."""
    path = self._write_manager.save(checkpoint_number=step)
    if self._scratch_directory is None:
      logging.info('Saved %s', path)
    else:
      shutil.rmtree(self._scratch_directory, ignore_errors=True)
      logging.info('Took part in saving checkpoint %d (the chief writes it)',
                   step)


def _first_line(error: Exception) -> str:
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__
