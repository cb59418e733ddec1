"""A study storage that stops answering (a database server restarting, a
network cut): how long a sweep process waits for it (Waits), and the wait
itself (Outage), while its trials run on."""

import dataclasses
import time

from ctl import errors
from ctl.runtime import studies
from ctl.sweep import trials as trials_lib

optuna = studies.import_optuna()


@dataclasses.dataclass(frozen=True)
class Waits:
  """How long a sweep process waits for others: a lapsed lease, a storage
  that stopped answering."""

  lease_seconds: float
  storage_seconds: float


def storage_errors() -> tuple[type[Exception], ...]:
  """What a storage raises while it does not answer (a database server
  restarting, a network cut): errors a sweep process waits out."""
  import sqlalchemy.exc  # pylint: disable=g-import-not-at-top
  # Optuna's RDBStorage raises its StorageInternalError for a failed commit.
  return (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
          optuna.exceptions.StorageInternalError)


@dataclasses.dataclass
class Outage:
  """The study's storage not answering: since when, and for how long a
  sweep process waits for it before it stops its trials."""

  url: str
  wait_seconds: float
  since: float | None = None
  error: Exception | None = None

  @property
  def down(self) -> bool:
    return self.since is not None

  def failed(self, error: Exception) -> bool:
    """Notes a storage call that failed; returns whether the wait is over."""
    if self.since is None:
      self.since = time.monotonic()
      trials_lib.say(
          f'the study storage {studies.shown(self.url)} does not answer '
          f'({_first_line(error)}); the running trials go on, and this '
          f'process tries again for up to {self.wait_seconds:g} s')
    self.error = error
    return self.expired

  @property
  def expired(self) -> bool:
    """Whether it has not answered for longer than the wait."""
    return self.down and time.monotonic() - self.since > self.wait_seconds

  def answered(self) -> None:
    """Notes a storage call that succeeded."""
    if self.since is not None:
      trials_lib.say(f'the study storage answers again after '
                     f'{time.monotonic() - self.since:.0f} s; going on')
    self.since = None

  def given_up(self) -> errors.CtlError:
    """The error a sweep process that waited in vain exits with."""
    return errors.CtlError(
        f'The study storage {studies.shown(self.url)} did not answer for '
        f'{self.wait_seconds:g} s (--storage_wait_seconds; '
        f'{_first_line(self.error)}). Its running trials were stopped with a '
        'checkpoint and stay RUNNING in the study: run the same command once '
        'the storage answers, and it resumes them.')


def _first_line(error: Exception | None) -> str:
  """The error's type and first line; for Optuna's StorageInternalError
  ("... invalid data in the commit ..."), its cause's (the database's)."""
  if isinstance(error, optuna.exceptions.StorageInternalError):
    error = error.__cause__ or error
  text = str(error).strip()
  return f'{type(error).__name__}: {text.splitlines()[0] if text else ""}'
