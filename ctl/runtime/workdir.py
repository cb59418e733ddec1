"""The files of a workdir, written only by the chief.

    workdir/config.json        the resolved config (config.<time>.json: earlier ones)
    workdir/checkpoints/       tf.train.CheckpointManager's ckpt-<step> files
    workdir/checkpoints/data/pipeline-<i>-of-<n>/   each worker's data position, per step
    workdir/train/, eval/      TensorBoard events; eval/results.json: the
                               side-car's or --mode=evaluate's last results
    workdir/results.json       final metrics, written when training finishes
    workdir/best/              the best checkpoint and best.json (checkpoints/best.py)
    workdir/export/            SavedModel and .keras files (serving/export.py)
    workdir/metrics.csv        every logged value (config.log_csv)
    workdir/mlflow.json        the MLflow run it logs to (config.mlflow)
    workdir/mlflow_pending.jsonl   values MLflow has not acknowledged yet
    workdir/workers/worker-<i>.json   each worker's status, written by that
                               worker (ctl/cluster/worker_status.py)
    workdir/workers/events.out.tfevents.*   each worker's timings of each
                               report, the chief's (cluster/worker_timings.py)
    workdir/diagnostics/worker-<i>-<pid>.txt   a worker's stacks and what it
                               knew of its peers (on a hang, or SIGUSR1)
    workdir/job_done           a parameter-server job's end, written by the
                               chief for its serving tasks (cluster/ps_cluster.py)

Each path is defined here, once; and so are a ctl process's scratch
folders in this machine's temporary directory:

    <tmp>/ctl-<pid>-<host>-workertemp_<i>    a worker's part of a save (not
                                            the chief's: it writes the workdir)
    <tmp>/ctl-<pid>-<host>-export-...       an export's staging and reading
                                            folders, for a workdir on an
                                            object store or another worker's
    <tmp>/ctl-<pid>-<host>-reading-...      a checkpoint read by the side-car
                                            evaluator of a gs:// workdir

Each is removed by the process that made it once done with it; a process
killed meanwhile cannot, so every `ctl.main` removes at start those whose
process is gone (`remove_scratch_leftovers`). The pid and host in the name
say whose it is: a folder of a live process, of another host sharing the
directory or of another user is left alone.
"""

import errno
import fcntl
import glob
import json
import os
import socket
import tempfile
import time

from absl import logging
import ml_collections

from ctl import config_checks
from ctl import errors
from ctl import storage

CONFIG_FILE = 'config.json'
RESULTS_FILE = 'results.json'
EXPORT_DIR = 'export'


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(workdir, 'checkpoints')


def data_position_dir(workdir: str) -> str:
  return os.path.join(checkpoint_dir(workdir), 'data')


def summary_dir(workdir: str, phase: str) -> str:
  return os.path.join(workdir, phase)


def results_path(workdir: str) -> str:
  return os.path.join(workdir, RESULTS_FILE)


def eval_results_path(workdir: str) -> str:
  """The side-car evaluator's latest results (workdir/eval/results.json)."""
  return os.path.join(summary_dir(workdir, 'eval'), RESULTS_FILE)


def best_dir(workdir: str) -> str:
  """The best checkpoint, and best.json naming it (checkpoints/best.py)."""
  return os.path.join(workdir, 'best')


def best_record_path(workdir: str) -> str:
  return os.path.join(best_dir(workdir), 'best.json')


def export_dir(workdir: str) -> str:
  """The export: SavedModel and .keras files (serving/export.py)."""
  return os.path.join(workdir, EXPORT_DIR)


def metrics_csv_path(workdir: str) -> str:
  """Every logged value as step,name,value rows (config.log_csv)."""
  return os.path.join(workdir, 'metrics.csv')


def mlflow_run_path(workdir: str) -> str:
  """The MLflow run this workdir logs to (config.mlflow)."""
  return os.path.join(workdir, 'mlflow.json')


def mlflow_pending_path(workdir: str) -> str:
  """Values queued for MLflow that it has not acknowledged, a JSON line
  each: sent by the next run when this one is killed (config.mlflow)."""
  return os.path.join(workdir, 'mlflow_pending.jsonl')


def job_done_path(workdir: str) -> str:
  """Where a parameter-server job's chief marks the job's end: its workers
  and servers stop serving (ctl/cluster/ps_cluster.py)."""
  return os.path.join(workdir, 'job_done')


def workers_dir(workdir: str) -> str:
  """Each worker's status file (ctl/cluster/worker_status.py), and the
  chief's TensorBoard events of every worker's timings (its `workers`
  run: ctl/cluster/worker_timings.py)."""
  return os.path.join(workdir, 'workers')


def worker_status_path(workdir: str, worker_index: int) -> str:
  return os.path.join(workers_dir(workdir), f'worker-{worker_index}.json')


def diagnostics_dir(workdir: str) -> str:
  """Workers' dumps: stacks, phase, peers (ctl/cluster/diagnostics.py)."""
  return os.path.join(workdir, 'diagnostics')


def diagnostics_path(workdir: str, worker_index: int, pid: int) -> str:
  return os.path.join(diagnostics_dir(workdir),
                      f'worker-{worker_index}-{pid}.txt')


class Lock:
  """One trainer per workdir: an exclusive lock on the workdir folder.

  A flock, which the kernel releases when the process ends, however it
  ends: a killed job leaves nothing held, and taking it writes nothing.
  Only the process that writes the workdir (the chief) takes it; readers
  (the side-car evaluator, --mode=evaluate and export) do not.
  """

  def __init__(self, workdir: str, enabled: bool = True):
    self._workdir = workdir
    self._enabled = enabled
    self._descriptor = None

  def __enter__(self) -> 'Lock':
    if storage.is_local(self._workdir) and os.path.isdir(self._workdir):
      self.acquire()
    return self

  def __exit__(self, *exc_info) -> None:
    if self._descriptor is not None:
      os.close(self._descriptor)  # Releases the lock.
      self._descriptor = None

  def acquire(self) -> None:
    """Takes the lock (once the workdir exists); a no-op once held.

    Raises:
      WorkdirInUse: another process holds it.
    """
    if not self._enabled or self._descriptor is not None:
      return
    if not storage.is_local(self._workdir):
      logging.info('Workdir %s is not on this machine and is not locked: '
                   'make sure no other job trains in it.', self._workdir)
      self._enabled = False
      return
    descriptor = os.open(self._workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
      fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
      os.close(descriptor)
      if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
        # A filesystem without locks (some network ones): go on unlocked.
        logging.warning('Cannot lock workdir %s (%s): make sure no other '
                        'job trains in it.', self._workdir, error)
        return
      raise errors.WorkdirInUse(
          f'Another job trains in workdir {self._workdir} '
          f'({_lock_holder(self._workdir)}). Nothing was written. Wait for '
          'it to finish or stop it, then run this command again; or train '
          'in another --workdir.') from error
    self._descriptor = descriptor

  def lost(self) -> bool:
    """Whether the locked folder is no longer at the workdir's path
    (deleted, moved or replaced, even by a folder of the same name that
    writes since recreated); False when nothing is locked."""
    if self._descriptor is None:
      return False
    try:
      now = os.stat(self._workdir)
    except OSError:
      return True
    locked = os.fstat(self._descriptor)
    return (now.st_dev, now.st_ino) != (locked.st_dev, locked.st_ino)


def vanished(workdir: str, detail: str) -> errors.CtlError:
  """The error for a workdir deleted, moved or unmounted mid-run."""
  return errors.CtlError(
      f'The workdir {workdir} vanished during the run (deleted, moved or '
      f'unmounted): {detail}. Restore it (the latest whole checkpoint in it '
      'resumes the run) or train in a new --workdir.')


def _lock_holder(path: str) -> str:
  """Who holds the flock on `path`, as /proc/locks and /proc/<pid> tell
  (this host only)."""
  stat = os.stat(path)
  device = f'{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}'
  try:
    with open('/proc/locks') as locks:
      for line in locks:
        fields = line.split()
        if 'FLOCK' in fields and fields[-3] == f'{device}:{stat.st_ino}':
          pid = fields[-4]
          with open(f'/proc/{pid}/cmdline', 'rb') as cmdline:
            command = cmdline.read().replace(b'\0', b' ').decode().strip()
          return f'process {pid} on this host: {command}'
  except (OSError, IndexError, ValueError):
    pass
  return 'a process of another host, or one this host does not show'


def remove_leftovers(workdir: str) -> None:
  """Removes the temporary files of JSON writes that a kill cut short
  (those of this host's processes that are gone: a side-car on another
  host, or a live one here, may be writing)."""
  if not storage.is_local(workdir):
    return  # Whole files are single uploads there: no temporary files.
  host = socket.gethostname()
  for folder in (workdir, summary_dir(workdir, 'eval'),
                 os.path.join(workdir, 'best'), workers_dir(workdir),
                 diagnostics_dir(workdir)):
    for path in storage.glob(os.path.join(glob.escape(folder), '*.tmp-*')):
      writer = path.rsplit('.tmp-', 1)[1]
      writer_host, _, pid = writer.rpartition('-')
      if writer_host == host and pid.isdigit() and not is_alive(int(pid)):
        logging.info('Removing %s, left by a write that was cut short.', path)
        storage.remove(path)


def is_alive(pid: int) -> bool:
  """Whether process `pid` of this host exists."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's.
    return True
  return True


def prepare(workdir: str) -> None:
  """Creates the workdir, or fails with a clear message if it cannot be written."""
  try:
    storage.makedirs(workdir)
    probe = os.path.join(workdir, f'.write-test-{os.getpid()}')
    storage.write_text(probe, 'ok')
    storage.remove(probe)
  except storage.io_errors(workdir) as error:
    raise errors.CtlError(
        f'Cannot write to workdir {workdir}: {error}. Pass a --workdir this '
        'user can write to.') from error


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Saves the config as JSON; keeps an earlier, different one beside it."""
  path = os.path.join(workdir, CONFIG_FILE)
  new = json.loads(config.to_json_best_effort())
  old = storage.read_json(path)
  if old is not None:
    changes = config_checks.differences(old, new)
    if not changes:
      return
    kept = os.path.join(workdir, f'config.{time.strftime("%Y%m%d-%H%M%S")}.json')
    storage.rename(path, kept)
    logging.warning('The config differs from the one this workdir was started '
                    'with (kept as %s):\n  %s', kept, '\n  '.join(changes))
  storage.write_json(path, new)


def read_results(workdir: str) -> dict | None:
  """Returns results.json's content, or None if training has not finished."""
  return storage.read_json(results_path(workdir))


_SCRATCH_PREFIX = 'ctl-'


def _owner_prefix(pid: int | None = None) -> str:
  """The start of the names of process pid's (this one's) folders."""
  pid = os.getpid() if pid is None else pid
  return f'{_SCRATCH_PREFIX}{pid}-{socket.gethostname()}-'


def scratch_path(name: str) -> str:
  """A path for this process's folder `name`, not created (a
  tf.train.CheckpointManager creates its own)."""
  return os.path.join(tempfile.gettempdir(), _owner_prefix() + name)


def make_scratch_folder(name: str) -> str:
  """Creates a new, private folder of this process; returns its path."""
  return tempfile.mkdtemp(prefix=_owner_prefix() + name + '-')


def remove_scratch_leftovers() -> None:
  """Removes the folders of ctl processes of this host that are gone."""
  directory = tempfile.gettempdir()
  for leftover in glob.glob(os.path.join(glob.escape(directory),
                                         f'{_SCRATCH_PREFIX}[0-9]*-*')):
    if _is_leftover(leftover):
      logging.info('Removing %s, left by a ctl process that was killed.',
                   leftover)
      storage.remove(leftover)


def _is_leftover(folder: str) -> bool:
  """Whether folder is this user's, of a process of this host that is gone."""
  name = os.path.basename(folder)
  pid = name[len(_SCRATCH_PREFIX):].split('-', 1)[0]
  if not pid.isdigit() or not name.startswith(_owner_prefix(int(pid))):
    return False
  try:
    mine = os.path.isdir(folder) and os.stat(folder).st_uid == os.getuid()
  except OSError:  # Removed meanwhile.
    return False
  return mine and not is_alive(int(pid))
