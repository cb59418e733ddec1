"""A GCS API server on localhost (tests/gcs_server.py) for a test run, and
the environment that points TensorFlow's own GCS client at it."""

import os
import pathlib
import signal
import subprocess
import sys
import uuid

import portpicker

import helpers

SERVER = pathlib.Path(__file__).resolve().parent / 'gcs_server.py'


class GcsServer:
  """The store and its front (tests/gcs_server.py). stop_front() and
  start_front() take the service away for a while, its objects kept."""

  def __init__(self, root: pathlib.Path):
    self.port = portpicker.pick_unused_port()
    self._store_port = portpicker.pick_unused_port()
    self._root = root
    self._store = self._front = None

  def start(self) -> None:
    self._store = self._serve('store', f'--port={self._store_port}')
    self.start_front()

  def start_front(self) -> None:
    self._front = self._serve(
        'front', f'--port={self.port}', f'--store_port={self._store_port}',
        f'--certificates={self._root / "certificates"}')

  def stop_front(self) -> None:
    _stop(self._front)
    self._front = None

  def stop(self) -> None:
    self.stop_front()
    _stop(self._store)
    self._store = None

  @staticmethod
  def _serve(*args: str) -> helpers.Watched:
    process = helpers.Watched([sys.executable, str(SERVER), *args],
                              server=True)
    process.wait_for(r'^ready$', timeout=60)
    return process

  def env(self) -> dict[str, str]:
    """What a process needs to reach it: TensorFlow reads these when it
    first touches a gs:// path."""
    return {
        'https_proxy': f'http://127.0.0.1:{self.port}',
        # Not for the workers' own gRPC connections to one another.
        'no_proxy': 'localhost,127.0.0.1',
        'CURL_CA_BUNDLE': str(self._root / 'certificates' / 'ca.pem'),
        'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'offline',  # No credentials asked.
        'NO_GCE_CHECK': 'true',
        # A request that fails is retried 3 times, not for minutes.
        'GCS_RETRY_CONFIG_MAX_RETRIES': '3',
    }

  def url(self, name: str = '') -> str:
    """A fresh gs:// folder of its bucket."""
    return f'gs://ctl-test/{name or "run"}-{uuid.uuid4().hex[:8]}'


def _stop(process) -> None:
  if process is None:
    return
  process.process.send_signal(signal.SIGTERM)
  try:
    process.process.wait(timeout=10)
  except subprocess.TimeoutExpired:
    process.kill()


def use_in_this_process(server: GcsServer) -> None:
  """Points this process's TensorFlow at the server (before its first
  gs:// access); the processes tests start do not inherit it."""
  helpers.IN_PROCESS_ONLY.update(server.env())
  os.environ.update(server.env())
