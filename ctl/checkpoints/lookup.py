"""A run's checkpoint to read, found in its workdir: the best, the latest,
or one named."""

import tensorflow as tf

from ctl import errors
from ctl import storage
from ctl.checkpoints import best as best_lib
from ctl.runtime import workdir as workdir_lib


def find(workdir: str, which: str = 'best') -> tuple[str, str]:
  """(path, 'best' | 'latest' | 'named') of a run's checkpoint.

  Raises:
    CtlError: there is none, or the best's files were lost.
  """
  if which not in ('best', 'latest'):
    if not storage.exists(f'{which}.index'):
      raise errors.CtlError(f'Checkpoint {which} does not exist (no '
                            f'{which}.index).')
    return which, 'named'
  if which == 'best':
    best = best_lib.kept_checkpoint(workdir)
    if best is not None:
      return best, 'best'
  latest = tf.train.latest_checkpoint(workdir_lib.checkpoint_dir(workdir))
  if latest is None:
    raise errors.CtlError(
        f'{workdir} has no checkpoint ({which}): train first.')
  return latest, 'latest'
