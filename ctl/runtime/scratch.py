"""A ctl process's folders in this machine's temporary directory.

    <tmp>/ctl-<pid>-<host>-workertemp_<i>    a worker's part of a save (not
                                            the chief's: it writes the workdir)
    <tmp>/ctl-<pid>-<host>-export-...       an export's staging and reading
                                            folders, for a workdir on an
                                            object store or another worker's
    <tmp>/ctl-<pid>-<host>-reading-...      a checkpoint read by the side-car
                                            evaluator of a gs:// workdir

Each is removed by the process that made it once done with it; a process
killed meanwhile cannot, so every `ctl.main` removes at start those whose
process is gone. The pid and host in the name say whose it is: a folder of a
live process, of another host sharing the directory or of another user is
left alone.
"""

import glob
import os
import socket
import tempfile

from absl import logging

from ctl import storage
from ctl.runtime import workdir as workdir_lib

_PREFIX = 'ctl-'


def _owner_prefix(pid: int | None = None) -> str:
  """The start of the names of process pid's (this one's) folders."""
  pid = os.getpid() if pid is None else pid
  return f'{_PREFIX}{pid}-{socket.gethostname()}-'


def path(name: str) -> str:
  """A path for this process's folder `name`, not created (a
  tf.train.CheckpointManager creates its own)."""
  return os.path.join(tempfile.gettempdir(), _owner_prefix() + name)


def make_folder(name: str) -> str:
  """Creates a new, private folder of this process; returns its path."""
  return tempfile.mkdtemp(prefix=_owner_prefix() + name + '-')


def remove_leftovers() -> None:
  """Removes the folders of ctl processes of this host that are gone."""
  directory = tempfile.gettempdir()
  for leftover in glob.glob(os.path.join(glob.escape(directory),
                                         f'{_PREFIX}[0-9]*-*')):
    if _is_leftover(leftover):
      logging.info('Removing %s, left by a ctl process that was killed.',
                   leftover)
      storage.remove(leftover)


def _is_leftover(folder: str) -> bool:
  """Whether folder is this user's, of a process of this host that is gone."""
  name = os.path.basename(folder)
  pid = name[len(_PREFIX):].split('-', 1)[0]
  if not pid.isdigit() or not name.startswith(_owner_prefix(int(pid))):
    return False
  try:
    mine = os.path.isdir(folder) and os.stat(folder).st_uid == os.getuid()
  except OSError:  # Removed meanwhile.
    return False
  return mine and not workdir_lib.is_alive(int(pid))
