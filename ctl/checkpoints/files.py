"""A checkpoint's files: copied (hard links where the filesystem has them),
removed, listed, checked whole and made durable; its state file checked."""

import os

import tensorflow as tf

from ctl import errors
from ctl import storage


def step_of(path: str) -> int:
  """The step of a checkpoint path: every checkpoint is named ckpt-<step>."""
  return int(path.rsplit('-', 1)[1])


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
  """Removes a checkpoint's files, and what a cut-short write left of it
  (TensorFlow writes its parts into a <prefix>_temp folder first)."""
  for file in storage.glob(f'{prefix}.*'):
    storage.remove(file)
  storage.remove(f'{prefix}_temp')


def make_durable(prefix: str) -> None:
  """Flushes checkpoint `prefix`'s files, and the folder naming them, to
  the disk (locally; an object store's uploads are durable already)."""
  storage.sync([*storage.glob(f'{prefix}.*'), os.path.dirname(prefix)])


def is_whole(prefix: str) -> bool:
  """Whether checkpoint `prefix` has its index and every data shard.

  TensorFlow writes each file under a temporary name and renames it once
  complete, the index last: a write that failed (a full disk) or was
  killed leaves no index, or, when files were deleted afterwards, fewer
  shards than their names count.
  """
  if not storage.exists(f'{prefix}.index'):
    return False
  shards = storage.glob(f'{prefix}.data-*-of-*')
  counts = {name.rsplit('-of-', 1)[1] for name in shards}
  return len(counts) == 1 and len(shards) == int(counts.pop())


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
  return sorted((step_of(path), path) for path in paths)


class SharedList(list):
  """A list that copy.copy returns as itself (CheckpointOptions copies its
  callbacks' list on each copy of the options)."""

  def __copy__(self) -> 'SharedList':
    return self


def check_state_file(directory: str) -> None:
  """Fails if the state file naming the checkpoints exists but is unreadable.

  tf.train.CheckpointManager would log a warning and start from scratch,
  overwriting the checkpoints. (A missing state file only means that the
  first save never completed: it is written last, atomically.)
  """
  state_file = os.path.join(directory, 'checkpoint')
  if not storage.exists(state_file):
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
