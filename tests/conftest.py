"""Shared by every test: tests/ is importable (helpers, split_cpu,
user_modules).

Tests are laid out like the package (tests/training/ for ctl/training/, ...);
pytest imports them in importlib mode (setup.cfg), so two folders may each
have a test module of the same name.
"""

import os
import pathlib
import random
import sys


TESTS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

# One intra-op thread a TensorFlow process, in this process and in the ctl
# processes the tests start (they inherit it, helpers.env_with): on 2 cores,
# pytest runs 2 files at once and a multi-worker test starts 2 or 3
# processes, and TensorFlow's default of a spinning thread a core for each
# of them made every process wait for the others' (the 2-worker test of
# tests/training/test_multi_worker.py: 57 s alone, 51 s with one thread).
# Both runs a test compares share it; a user's run keeps TensorFlow's own.
os.environ.setdefault('TF_NUM_INTRAOP_THREADS', '1')


import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope='session')
def gcs_server(tmp_path_factory):
  """A GCS API server on localhost (tests/gcs.py), started once per test
  run when a test first asks for it; this process's TensorFlow reaches it."""
  import gcs  # pylint: disable=g-import-not-at-top
  server = gcs.GcsServer(tmp_path_factory.mktemp('gcs'))
  server.start()
  gcs.use_in_this_process(server)
  yield server
  server.stop()


@pytest.fixture(scope='session')
def postgres_server():
  """A PostgreSQL server on localhost (tests/postgres.py), started once per
  test run when a test first asks for it."""
  import postgres  # pylint: disable=g-import-not-at-top
  server = postgres.PostgresServer()
  server.start()
  yield server
  server.stop()


@pytest.fixture(autouse=True)
def process_state_as_it_was():
  """What a run in this process changes for the whole process, undone for
  the tests after it (pytest-xdist runs files in another order than one
  process would): Python's `random` is seeded afresh before each test (a
  run seeds it with config.seed, and a test's kill point drawn from it
  would be the same each time), and TensorFlow's op determinism, which a
  run with config.deterministic turns on (ctl/training/run.py), is off
  again after it (a later seedless random op would be refused)."""
  random.seed()
  started = _watched_started()
  made_before = len(started)
  yield
  # A test that failed half-way leaves its processes (a whole ctl.launch
  # job) running: killed, not left to load the tests after it.
  for watched in _watched_started()[made_before:]:
    if watched.process.poll() is None:
      watched.process.kill()
  if 'tensorflow' in sys.modules:
    # pylint: disable=g-import-not-at-top
    from tensorflow.python.framework import config as tf_config
    if tf_config.is_op_determinism_enabled():
      tf_config.disable_op_determinism()


def _watched_started() -> list:
  """helpers.Watched's processes so far (none before anything imported
  helpers)."""
  helpers = sys.modules.get('helpers')
  return helpers.Watched.started if helpers else []
