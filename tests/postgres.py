"""A real PostgreSQL server on localhost for a test run (Debian's binaries,
run as the unprivileged user `nobody`: PostgreSQL refuses to run as root).

.ci/run installs the binaries on a machine without them; a test that needs
them fails, saying so, rather than skipping.
"""

import os
import pathlib
import shutil
import subprocess
import tempfile

import portpicker

BIN = pathlib.Path('/usr/lib/postgresql/15/bin')
USER = 'nobody'


class PostgresServer:
  """initdb, pg_ctl start and stop, databases created with psql."""

  def __init__(self):
    if not (BIN / 'initdb').exists():
      raise AssertionError(
          f'PostgreSQL 15 is not installed ({BIN}/initdb is missing): '
          'apt-get install -y postgresql (as .ci/run does).')
    self.port = portpicker.pick_unused_port()
    # Not under pytest's tmp_path: its parents are closed to `nobody`.
    self._data = pathlib.Path(tempfile.mkdtemp(prefix='ctl-postgres-'))
    shutil.chown(self._data, USER)

  def _as_user(self, *command: str) -> None:
    subprocess.run(['runuser', '-u', USER, '--', *command], check=True,
                   timeout=120, capture_output=True)

  def start(self) -> None:
    self._as_user(str(BIN / 'initdb'), '-D', str(self._data), '-A', 'trust',
                  '-U', 'ctl')
    self._as_user(str(BIN / 'pg_ctl'), '-D', str(self._data), '-o',
                  f'-p {self.port} -k {self._data} '
                  '-c listen_addresses=127.0.0.1',
                  '-l', str(self._data / 'log'), '-w', 'start')

  def stop(self) -> None:
    self._as_user(str(BIN / 'pg_ctl'), '-D', str(self._data), '-m', 'fast',
                  'stop')
    shutil.rmtree(self._data, ignore_errors=True)

  def create_database(self, name: str) -> str:
    """Creates a database; returns its URL, as a user writes it."""
    subprocess.run([str(BIN / 'psql'), '-h', '127.0.0.1', '-p', str(self.port),
                    '-U', 'ctl', '-d', 'postgres', '-c',
                    f'create database {name}'],
                   check=True, timeout=60, capture_output=True,
                   env={**os.environ, 'PGCONNECT_TIMEOUT': '10'})
    return f'postgresql://ctl@127.0.0.1:{self.port}/{name}'

  def halt(self) -> None:
    """Stops the server as a restart does, keeping its data and port."""
    self._as_user(str(BIN / 'pg_ctl'), '-D', str(self._data), '-m', 'fast',
                  'stop')

  def start_again(self) -> None:
    """Starts a halted server on the same data and port."""
    self._as_user(str(BIN / 'pg_ctl'), '-D', str(self._data), '-o',
                  f'-p {self.port} -k {self._data} '
                  '-c listen_addresses=127.0.0.1',
                  '-l', str(self._data / 'log'), '-w', 'start')
