"""A TensorFlow process's life: started quietly, its signals, leaving no
files, ended fast.

- TensorFlow's start-up prints a dozen lines before its logging is set up
  (oneDNN, CUDA stubs, CPU instructions, twice), and an error-level "failed
  call to cuInit" on every machine without a GPU. None of it is actionable,
  so `quiet_start_up` hides exactly those lines and keeps everything else.
  TF_CPP_MIN_LOG_LEVEL=0 shows everything.
- AutoGraph writes each converted function to a temporary `.py` file and
  deletes it at exit, but not the bytecode Python cached beside it
  (`$TMPDIR/__pycache__/__autograph_generated_file*.pyc`), which piled up on
  every run. `remove_autograph_bytecode_at_exit` deletes the orphans.
- `process_start_time`: when the program started; `StartUp`: a run's
  start-up phase by phase from then (or from the run's own start in a warm
  process), for the start-up time the log and results.json report.
- `exit_now` skips TensorFlow's shutdown, which takes seconds under
  MultiWorkerMirroredStrategy (4 to 11 measured, more when a peer is gone),
  time a preemption's grace period cannot spare.
- SIGTERM or Ctrl-C (`StopSignal`): finish the current loop of steps, save,
  exit with 42. Schedulers preempt with SIGTERM and, after a grace period,
  SIGKILL (Slurm's KillWait, Kubernetes' terminationGracePeriodSeconds).
  The handler only records the request; the training loop passes it into
  the next `train_loop` call, which all-reduces it with the other workers'
  requests, so every worker stops after the same step and takes part in the
  same save. That costs no extra synchronisation, so it is used for every
  strategy. Ctrl-C (SIGINT) does the same; a second Ctrl-C stops at once,
  without saving (the latest checkpoint stays the one to resume from).
  Once a MultiWorkerMirroredStrategy exists, TensorFlow's runtime catches
  SIGTERM and only sets a flag of its own; a Python handler installed after
  the strategy is built replaces that, so `StopSignal` must be entered
  after `distribution.build_strategy`.
- Any other signal a run answers while it trains (`OnSignal`: SIGUSR1, the
  diagnostics dump) reaches Python's handlers only when the main thread
  runs Python, and a hung worker's main thread waits inside TensorFlow. So
  the handler does nothing itself: the signal's number goes through
  Python's wakeup file descriptor (`signal.set_wakeup_fd`, written by the
  C-level handler on whichever thread got the signal) to a thread of ours,
  which calls the function.
"""

import atexit
from collections.abc import Callable
import contextlib
import functools
import gc
import glob
import os
import signal
import sys
import tempfile
import threading
import time

from absl import logging

import ctl
from ctl.runtime import deferred_imports

# Start-up lines that say nothing a user can act on.
_NOISE = (
    'All log messages before absl::InitializeLog() is called',
    'port.cc:',  # oneDNN custom operations are on.
    'cudart_stub.cc:',  # Could not find cuda drivers.
    'cpu_feature_guard.cc:',  # This binary is optimized to use ...
    'To enable the following instructions:',
    'cuda_platform.cc:',  # failed call to cuInit (no GPU).
    'cuda_executor.cc:',
    'gpu_device.cc:',  # Cannot dlopen some GPU libraries (no GPU).
)


@contextlib.contextmanager
def quiet_start_up():
  """Within it, TensorFlow's start-up lines are hidden from stderr.

  Unless TF_CPP_MIN_LOG_LEVEL is set, sets it to 1 (TensorFlow's INFO logs
  hidden, warnings and errors kept). Then captures what is written to the
  process's stderr (file descriptor 2: the lines come from C++, and
  TensorFlow prints them whatever the level) and prints it again without
  `_NOISE`. TF_CPP_MIN_LOG_LEVEL=0 shows everything.
  """
  if os.environ.get('TF_CPP_MIN_LOG_LEVEL') == '0':
    yield  # The user asked for everything.
    return
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
  sys.stderr.flush()
  saved_stderr = os.dup(2)
  with tempfile.TemporaryFile(mode='w+b') as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved_stderr, 2)
      os.close(saved_stderr)
      captured.seek(0)
      kept = [line for line in captured.read().decode(errors='replace')
              .splitlines(keepends=True)
              if not any(noise in line for noise in _NOISE)]
      sys.stderr.write(''.join(kept))


@functools.cache
def import_tensorflow() -> None:
  """Imports TensorFlow and Keras and finds the devices, once a process:
  quietly, without the garbage collector (it ran 958 times over the
  import's growing heap; what the import made is then frozen with
  `gc.freeze`), and with Keras's scikit-learn and matplotlib integrations
  deferred (BENCHMARKS.md, the two "Start-up" sections of 2026-11-29)."""
  with (_garbage_collection_paused(), quiet_start_up(),
        deferred_imports.keras_integrations_deferred()):
    import keras  # pylint: disable=g-import-not-at-top,unused-import
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    # Finding the devices is when CUDA reports that there is no GPU.
    tf.config.list_physical_devices()


@contextlib.contextmanager
def _garbage_collection_paused():
  """Within it, no garbage collection; after it, what exists is frozen."""
  was_enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    gc.freeze()
    if was_enabled:
      gc.enable()


def remove_autograph_bytecode_at_exit() -> None:
  """At exit, deletes AutoGraph's cached bytecode whose source is gone.

  Call before anything is converted: exit handlers run last-in first-out,
  so this one runs after AutoGraph's own, which deletes the sources. Once
  a process: a warm process (ctl/warm.py) calls it for every run."""
  atexit.unregister(_remove_orphaned_autograph_bytecode)
  atexit.register(_remove_orphaned_autograph_bytecode, tempfile.gettempdir())


def _remove_orphaned_autograph_bytecode(directory: str) -> None:
  cache = os.path.join(directory, '__pycache__')
  for path in glob.glob(os.path.join(cache, '__autograph_generated_file*.pyc')):
    module = os.path.basename(path).split('.', 1)[0]
    if not os.path.exists(os.path.join(directory, f'{module}.py')):
      with contextlib.suppress(OSError):  # Another process removed it.
        os.remove(path)
  with contextlib.suppress(OSError):  # Only if empty: others' files stay.
    os.rmdir(cache)


def exit_now(code: int) -> None:
  """Exits without TensorFlow's shutdown, once everything is flushed.

  The caller must have closed every summary writer and waited for every
  checkpoint (train_and_evaluate has, when it returns or raises).
  """
  from ctl.runtime import tf_internals  # pylint: disable=g-import-not-at-top
  # atexit handlers still run: AutoGraph deletes its temporary files there.
  tf_internals.run_exit_handlers()
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


# Longer than Python takes to start and import ctl: a process older than
# that ran something else first.
_INTERPRETER_START_SECONDS = 10.0


def process_start_time() -> float:
  """time.monotonic() when this program started.

  The process's start (Linux); but a shell execs its last command in its
  own process, so `pip install ... && python -m ctl.main` in `bash -c`
  started when pip did: where the process is older than Python's start-up
  explains, the time ctl was imported instead.
  """
  started = _process_start_time()
  if ctl.IMPORT_TIME - started > _INTERPRETER_START_SECONDS:
    return ctl.IMPORT_TIME
  return started


def _process_start_time() -> float:
  """time.monotonic() when this process started (Linux), else now."""
  try:
    with open('/proc/self/stat') as file:
      # Field 22, after the parenthesised command name, in clock ticks.
      start_ticks = int(file.read().rsplit(')', 1)[1].split()[19])
    with open('/proc/uptime') as file:
      uptime = float(file.read().split()[0])
    age = uptime - start_ticks / os.sysconf('SC_CLK_TCK')
    return time.monotonic() - age
  except (OSError, ValueError, IndexError):
    return time.monotonic()


class StartUp:
  """A run's start-up, phase by phase, up to its first loop's end.

  Each phase ends when `end` is first called with its name and lasts from
  the end of the phase before (or the run's start): the phases' seconds add
  up to timing.first_step_seconds of results.json.
  """

  def __init__(self, started: float):
    """started: time.monotonic() when the run started: its process's start,
    or its own in a process that ran others before (ctl/warm.py)."""
    self.started = started
    self._ends = {}  # {phase: time.monotonic() when it ended}, in order.

  def end(self, phase: str, when: float | None = None) -> None:
    """Ends `phase` now (or at `when`); a phase ends once."""
    self._ends.setdefault(phase, time.monotonic() if when is None else when)

  def seconds(self) -> dict[str, float]:
    """Each phase ended so far: its seconds."""
    seconds, before = {}, self.started
    for phase, end in self._ends.items():
      seconds[phase] = max(0.0, end - before)
      before = max(before, end)
    return seconds


def process_start_up() -> StartUp:
  """The start-up of a run that started with its process: Python's own
  start-up ended when ctl was imported."""
  start_up = StartUp(process_start_time())
  start_up.end('python', max(ctl.IMPORT_TIME, start_up.started))
  return start_up


def run_start_up() -> StartUp:
  """The start-up of a run that starts now, in a process that has Python
  (and maybe more) started: only what it still imports is counted."""
  start_up = StartUp(time.monotonic())
  start_up.end('python', start_up.started)
  return start_up


# The code of a process stopped by a second Ctrl-C, as a shell reports one
# ended by SIGINT.
EXIT_INTERRUPTED = 128 + signal.SIGINT


class StopSignal:
  """A context in which SIGTERM and SIGINT request a stop instead of
  killing."""

  def __init__(self, signums: tuple[int, ...] = (signal.SIGTERM,
                                                 signal.SIGINT)):
    self._signums = signums
    self._previous = {}
    self.requested = False
    self.received = None  # The name of the signal that asked first.

  def __enter__(self) -> 'StopSignal':
    if threading.current_thread() is threading.main_thread():
      for signum in self._signums:
        self._previous[signum] = signal.signal(signum, self._handle)
    else:
      logging.warning('Not on the main thread: SIGTERM will not stop '
                      'training cleanly.')
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    del frame
    name = 'Ctrl-C' if signum == signal.SIGINT else signal.Signals(signum).name
    if self.requested and signum == signal.SIGINT:
      # Straight to the file descriptor: no Python buffer to meet.
      os.write(2, b'\nctl: error: Ctrl-C twice: stopped at once, without '
               b'saving. Run the same command again to resume from the '
               b'latest checkpoint.\n')
      os._exit(EXIT_INTERRUPTED)  # pylint: disable=protected-access
    if self.requested:
      return
    # The request first: whatever happens to the message below (a signal
    # handler that writes can meet the interrupted write of the same
    # stream), the stop is not lost.
    self.received = name
    self.requested = True
    try:
      logging.warning('Received %s: saving a checkpoint after this loop of '
                      'steps, then exiting with code 42%s.', name,
                      ' (Ctrl-C again: stop now, without saving)'
                      if signum == signal.SIGINT else '')
    except Exception:  # pylint: disable=broad-except
      pass


class OnSignal:
  """A context in which `signum` calls `call()` on a thread of its own,
  named `name` (training goes on). Enter it on the main thread; elsewhere
  it does nothing."""

  def __init__(self, signum: int, call: Callable[[], None], name: str):
    self._signum = signum
    self._call, self._name = call, name
    self._pipe = None
    self._previous = None
    self._previous_fd = -1
    self._thread = None

  def __enter__(self) -> 'OnSignal':
    if threading.current_thread() is not threading.main_thread():
      return self
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # set_wakeup_fd needs it.
    self._previous = signal.signal(self._signum, lambda *_: None)
    try:
      self._previous_fd = signal.set_wakeup_fd(write_end,
                                               warn_on_full_buffer=False)
    except ValueError:
      signal.signal(self._signum, self._previous)
      os.close(read_end)
      os.close(write_end)
      return self
    self._pipe = (read_end, write_end)
    self._thread = threading.Thread(target=self._serve, daemon=True,
                                    name=self._name)
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    if self._pipe is None:
      return
    signal.set_wakeup_fd(self._previous_fd)
    signal.signal(self._signum, self._previous)
    os.write(self._pipe[1], b'\0')  # Ends _serve.
    self._thread.join()
    for end in self._pipe:
      os.close(end)
    self._pipe = None

  def _serve(self) -> None:
    """Calls the function for each signal, until a zero byte."""
    while True:
      received = os.read(self._pipe[0], 64)
      if not received or 0 in received:
        return
      if self._signum in received:
        self._call()
