"""A TensorFlow process ends at once: its exit handlers run, and nothing the
interpreter's shutdown would wait for holds it."""

import subprocess
import sys

import helpers

_EXITS_NOW = '''
import atexit, threading
from ctl.runtime import tf_process
atexit.register(print, 'exit handlers ran', flush=True)
# What the interpreter's shutdown waits for, as it waits for TensorFlow's
# under MultiWorkerMirroredStrategy: here a thread that runs for an hour.
threading.Thread(target=threading.Event().wait, args=(3600,)).start()
tf_process.exit_now(3)
'''


def test_exit_now_runs_the_exit_handlers_and_skips_the_shutdown():
  # The bound only catches a process held by the thread.
  run = subprocess.run([sys.executable, '-c', _EXITS_NOW], cwd=helpers.REPO,
                       env=helpers.env_with(), capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 3, run.stderr[-3000:]
  assert run.stdout.splitlines() == ['exit handlers ran']


_REGISTERS_THREE_TIMES = '''
from ctl.runtime import tf_process
tf_process._remove_orphaned_autograph_bytecode = (
    lambda directory: print('cleaned', flush=True))
for _ in range(3):  # A warm process's runs, each as ctl.main's.
  tf_process.remove_autograph_bytecode_at_exit()
'''


def test_the_bytecode_cleanup_is_registered_once_for_many_runs():
  run = subprocess.run([sys.executable, '-c', _REGISTERS_THREE_TIMES],
                       env=helpers.env_with(), capture_output=True, text=True,
                       timeout=120)
  assert run.returncode == 0, run.stderr
  assert run.stdout.splitlines() == ['cleaned']


_IMPORTS_TENSORFLOW = '''
import gc
from ctl.runtime import tf_process
collections = []
gc.callbacks.append(lambda phase, info: phase == 'start' and
                    collections.append(info['generation']))
tf_process.import_tensorflow()
during_import, frozen = len(collections), gc.get_freeze_count()
left_by_a_run = [[] for _ in range(1000)]
tf_process.import_tensorflow()  # A warm process's next run.
print(during_import, gc.isenabled(), frozen > 100_000,
      gc.get_freeze_count() == frozen)
'''


def test_tensorflow_is_imported_without_garbage_collections_and_frozen():
  # Collections during the import cost about 0.8 s of its 5 to 6 s here
  # (BENCHMARKS.md, "Start-up"); the collector is back on after it. A
  # second call (a warm process's next run) freezes nothing: what a run
  # left would live as long as the process.
  run = subprocess.run([sys.executable, '-c', _IMPORTS_TENSORFLOW],
                       env=helpers.env_with(), capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.split() == ['0', 'True', 'True', 'True']
