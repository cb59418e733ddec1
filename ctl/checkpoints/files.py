"""A checkpoint's files: copied (hard links where the filesystem has them),
removed, listed, and found in a workdir (the best, the latest, or one
named)."""

import os

import tensorflow as tf

from ctl import errors
from ctl import storage
from ctl.checkpoints import best as best_lib
from ctl.checkpoints import manager
from ctl.runtime import workdir as workdir_lib


def copy_checkpoint(source: str, destination: str) -> None:
  """Copies the files of checkpoint `source` (a path prefix) to
  `destination`, hard-linking them where the filesystem allows: a link
  costs nothing, and keeps the files readable even when training rotates
  the source away."""
  files = storage.glob(f'{source}.*')
  if not any(file.endswith('.index') for file in files):
    raise FileNotFoundError(f'{source}.index')
  for file in files:
    storage.link_or_copy(file, destination + file[len(source):])


def snapshot_checkpoint(source: str, destination: str) -> bool:
  """copy_checkpoint for a checkpoint that may be deleted meanwhile
  (rotated away, or a best replaced): False, with nothing left at
  destination, when its files were gone before they were all linked."""
  try:
    copy_checkpoint(source, destination)
    return True
  except (FileNotFoundError, tf.errors.NotFoundError):
    remove_checkpoint(destination)
    return False


def remove_checkpoint(prefix: str) -> None:
  for file in storage.glob(f'{prefix}.*'):
    storage.remove(file)


def listed(directory: str) -> list[tuple[int, str]]:
  """(step, path) of the checkpoints training's state file lists, oldest
  first (empty while there are none)."""
  try:
    state = tf.train.get_checkpoint_state(directory)
  except (ValueError, tf.errors.OpError):  # Being replaced: read it later.
    return []
  if state is None:
    return []
  paths = [path if os.path.isabs(path) or not storage.is_local(path)
           else os.path.join(directory, path)
           for path in state.all_model_checkpoint_paths]
  return sorted((manager.step_of(path), path) for path in paths)


def find(workdir: str, which: str = 'best') -> tuple[str, str]:
  """(path, 'best' | 'latest' | 'named') of a run's checkpoint.

  Raises:
    CtlError: there is none.
  """
  if which not in ('best', 'latest'):
    if not storage.exists(f'{which}.index'):
      raise errors.CtlError(f'Checkpoint {which} does not exist (no '
                            f'{which}.index).')
    return which, 'named'
  if which == 'best':
    kept = best_lib.read(workdir)
    if kept is not None:
      return os.path.join(workdir_lib.best_dir(workdir), kept['checkpoint']), 'best'
  latest = tf.train.latest_checkpoint(workdir_lib.checkpoint_dir(workdir))
  if latest is None:
    raise errors.CtlError(
        f'{workdir} has no checkpoint ({which}): train first.')
  return latest, 'latest'
