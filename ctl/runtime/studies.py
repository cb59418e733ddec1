"""A search's Optuna study, as both sides open it: the sweep process
(ctl/sweep/study.py) and a trial's chief (ctl/training/pruning.py).

Optuna (the extra ctl[sweep]) is imported only when a study is opened: a
run that is no search's trial never imports it.
"""

import os
import time
from typing import Any

from absl import logging

from ctl import errors
from ctl import storage

SEARCH = 'ctl.search'  # The study's user attribute describing its search.
# How a trial's stop reason starts when its pruner stopped it (results.json).
PRUNED = 'pruned'
# A journal's tail is read back in blocks of this size to find its last
# whole record.
_TAIL_BLOCK_BYTES = 64 * 1024
# Opening a new database creates Optuna's tables; two sweep processes
# opening it at once race there (one gets "type ... already exists"), and
# the loser's next try finds the tables made.
_SCHEMA_RACE_TRIES = 5


def was_pruned(results: dict) -> bool:
  """Whether a run's results say its study's pruner stopped it."""
  stopped = results.get('stopped') or {}
  return (stopped.get('reason') or '').startswith(PRUNED)


def import_optuna():
  """Optuna, imported on first use: only searches need it."""
  try:
    import optuna  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise errors.ConfigError(
        'A search needs Optuna: pip install "ctl[sweep]" (or optuna>=4, and '
        'psycopg[binary] for a PostgreSQL storage).') from error
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  return optuna


def shown(url: str) -> str:
  """The storage URL without its password, for messages."""
  if '://' not in url:
    return url
  from sqlalchemy.engine import make_url  # pylint: disable=g-import-not-at-top
  try:
    return make_url(url).render_as_string(hide_password=True)
  except Exception:  # pylint: disable=broad-except
    return url.rsplit('@', 1)[-1]


def open_storage(url: str):
  """The storage behind url (a journal file's path, or a database URL).

  Raises:
    CtlError: it does not answer (exit 1).
  """
  optuna = import_optuna()
  try:
    if '://' not in url:
      from optuna.storages import journal  # pylint: disable=g-import-not-at-top
      storage.makedirs(os.path.dirname(url))
      _move_cut_record_aside(url, journal.JournalFileSymlinkLock(url))
      return journal.JournalStorage(journal.JournalFileBackend(url))
    engine_kwargs = {}
    if url.startswith('postgresql'):
      # A host that drops packets must not hang the sweep.
      engine_kwargs = {'connect_args': {'connect_timeout': 10}}
    return _open_database(optuna, url, engine_kwargs)
  except Exception as error:  # pylint: disable=broad-except
    raise unreachable(url, error) from error


def _move_cut_record_aside(path: str, lock) -> None:
  """Moves a journal's cut last record (its writer killed as it wrote, the
  file cut short by a copy or a full disk) to a backup file beside it,
  saying so: Optuna would append the next record onto the cut one, and no
  process could read the journal again.

  Done under the journal's own lock (the one Optuna's writers hold), so a
  record being written is never taken for a cut one.
  """
  if not os.path.exists(path):
    return
  lock.acquire()
  try:
    with open(path, 'rb+') as journal_file:
      size = journal_file.seek(0, os.SEEK_END)
      start = _last_record_end(journal_file, size)
      if start == size:
        return
      journal_file.seek(start)
      cut = journal_file.read()
      backup = f'{path}.cut-{time.strftime("%Y%m%d-%H%M%S")}'
      with open(backup, 'ab') as backup_file:
        backup_file.write(cut)
        backup_file.flush()
        os.fsync(backup_file.fileno())
      journal_file.truncate(start)
      journal_file.flush()
      os.fsync(journal_file.fileno())
  finally:
    lock.release()
  logging.warning(
      'The study journal %s ended in a cut record (%d bytes, no line end: '
      'its writer was killed as it wrote, or the file was cut short); moved '
      'it to %s. The study goes on from the records before it.', path,
      len(cut), backup)


def _last_record_end(journal_file, size: int) -> int:
  """The offset just after the journal's last line end (0 if none)."""
  end = size
  while end > 0:
    start = max(0, end - _TAIL_BLOCK_BYTES)
    journal_file.seek(start)
    block = journal_file.read(end - start)
    newline = block.rfind(b'\n')
    if newline >= 0:
      return start + newline + 1
    end = start
  return 0


def _open_database(optuna, url: str, engine_kwargs: dict):
  """An RDBStorage, tried again where another process was creating its
  tables at the same moment."""
  import sqlalchemy.exc  # pylint: disable=g-import-not-at-top
  for attempt in range(_SCHEMA_RACE_TRIES):
    try:
      return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except (sqlalchemy.exc.ProgrammingError,
            sqlalchemy.exc.IntegrityError):
      if attempt == _SCHEMA_RACE_TRIES - 1:
        raise
      time.sleep(0.5 * (attempt + 1))


def unreachable(url: str, error: Exception) -> errors.CtlError:
  """The error for a storage that does not answer."""
  text = str(error).strip()
  first_line = text.splitlines()[0] if text else ''
  return errors.CtlError(
      f'The study storage {shown(url)} does not answer: '
      f'{type(error).__name__}: {first_line}. Check --storage (a database URL '
      'such as postgresql://user@host:5432/db, the database created).')


def make_pruner(name: str | None, options: dict[str, Any]):
  """The Optuna pruner a Search names (None: never prunes)."""
  pruners = import_optuna().pruners
  classes = {None: pruners.NopPruner, 'median': pruners.MedianPruner,
             'asha': pruners.SuccessiveHalvingPruner,
             'hyperband': pruners.HyperbandPruner}
  return classes[name](**options)


def trial_id(study, number: int) -> int:
  """The storage's id of the study's trial of that number."""
  return study._storage.get_trial_id_from_study_id_trial_number(  # pylint: disable=protected-access
      study._study_id, number)  # pylint: disable=protected-access
