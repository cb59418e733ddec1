"""Each worker's status file: where it is, how fast, and how it ended.

    workdir/workers/worker-<i>.json   (workdir.worker_status_path)

A tiny JSON file per worker, not a gather over the collectives nor the
coordination service's key-value store: a gather hangs with the job it
should explain, the key-value store lives in the chief's process and dies
with it, and neither outlives the job for `python -m ctl.status`. A file
is written by its worker alone, through ctl/storage.py (so gs:// works
too), and read by the others only when they need it: at a hang, at a
report and after a loop (stragglers), and by ctl.status.

In a job of several workers a background thread writes it: when training
starts, at each report (the `worker-status` action, after the log line),
when an evaluation or a checkpoint begins, every `heartbeat_seconds`, and
when the run ends (its state, reason and exit code). The training thread
only sets fields, so a slow store never slows a step, and a worker hung
inside a collective still rewrites its file: `time` stays fresh while
`progress_time` (the watchdog's last step or beat) ages. A job of one
worker has no peer to wait on: its training thread writes the file at the
same moments (reports and loops at most once a second), with no
heartbeat (`heartbeat_seconds` null): its `time` is its progress.

Each report holds the seconds this worker spent since the previous one in
each phase: 'training' (its loops of steps, wall time), 'training_cpu'
(the process's CPU time in them), 'stalled' (kept from running:
StallMeter), 'input_wait' (its steps waiting for their batches, timed in
the loop's graph: ctl/cluster/input_wait.py, in jobs of several workers),
and each action by its name ('checkpoint', 'evaluate', ...).

In jobs of several workers it also holds `samples`: at the end of a loop of
steps, at most every SAMPLE_SECONDS, the step and this worker's running
totals (its loops' wall time, their CPU time, its stalls, its input wait).
The chief's straggler check (ctl/cluster/stragglers.py) compares the
workers' time per step over the last seconds of them, whatever the report
interval.
"""

from collections.abc import Callable
import collections
import contextlib
import os
import socket
import threading
import time

from absl import logging

from ctl import errors
from ctl import storage
from ctl.cluster import stall_meter
from ctl.runtime import workdir as workdir_lib

# The states of a worker's run, as ctl.status shows them.
RUNNING, FINISHED, STOPPED, FAILED = 'running', 'finished', 'stopped', 'failed'

# Reports kept in the file: enough for the chief to see each report of
# every worker (ctl/cluster/worker_timings.py) across files written
# MIN_WRITE_SECONDS apart, with reports 10 times a second.
REPORTS_KEPT = 32

# The longest time between two writes of a live worker of several; the
# shortest between two of one worker after its loops and reports, written
# on its training thread, on remote storage (a write to gs:// takes about
# 0.3 s; MIN_WRITE_SECONDS on local storage).
MAX_HEARTBEAT_SECONDS = REMOTE_OWN_WRITE_SECONDS = 10.0

# The phases of a loop of steps (the others are actions).
LOOP_PHASES = ('first step', 'training')

# Phases whose start is written at once (the others wait for the heartbeat).
_WRITTEN_PHASES = ('training', 'evaluate', 'checkpoint')

# The shortest time between two writes (but the last): frequent reports
# (the digits job reports every 11 steps, 10 times a second) are written
# together, so the writer costs the same whatever the report interval.
MIN_WRITE_SECONDS = 1.0

# The shortest time between two samples, and how many a file keeps: the
# last 16 s at least, for the straggler check's window.
SAMPLE_SECONDS = 0.5
SAMPLES_KEPT = 32

# How long a run's end waits for its last write (a hung store holds no exit).
_FINAL_WRITE_SECONDS = 10.0


def heartbeat_seconds(timeout_seconds: float) -> float:
  """Seconds between two writes: a quarter of the watchdog's timeout, so
  that a peer's file older than half of it means that peer stopped."""
  if timeout_seconds <= 0:
    return MAX_HEARTBEAT_SECONDS
  return min(MAX_HEARTBEAT_SECONDS, timeout_seconds / 4)


class WorkerStatus:
  """This worker's status file, written from `start()` (a run that fails
  its checks at start writes nothing); with workdir None it only times."""

  def __init__(self, workdir: str | None, *, worker_index: int = 0,
               num_workers: int = 1, timeout_seconds: float = 0.0,
               progress_age: Callable[[], float] = lambda: 0.0,
               on_report=None, input_wait=None,
               job: dict[str, int] | None = None):
    """Args as named.

    Args:
      job: a parameter-server job's task counts by job, on its chief's.
      progress_age: seconds since this worker last made progress (the
        watchdog's seconds_since_progress).
      on_report: the chief's look at every worker's file, on the writer
        thread after each report's write (a worker_timings.WorkerTimings:
        the straggler check, the per-worker timings); its timings gathered
        so far go on each report's event.
    """
    self.workdir = workdir
    self.path = (workdir_lib.worker_status_path(workdir, worker_index)
                 if workdir else None)
    self.worker_index = worker_index
    self._progress_age = progress_age
    self._on_report = on_report
    self._reported = False  # A report waits for the writer thread.
    self._stalls = None  # The StallMeter, once training starts.
    self._stalled_before = 0.0  # Its seconds at the last report.
    self._threaded = num_workers > 1
    self._last_write = None  # When the training thread wrote (one worker).
    self._own_write_seconds = (MIN_WRITE_SECONDS if storage.is_local(
        workdir or '') else REMOTE_OWN_WRITE_SECONDS)
    self._folder_made = False
    self._fields = {
        'worker': worker_index, 'num_workers': num_workers,
        'host': socket.gethostname(), 'pid': os.getpid(),
        'timeout_seconds': timeout_seconds,
        'heartbeat_seconds': (heartbeat_seconds(timeout_seconds)
                              if self._threaded else None),
        'started': time.time(), 'state': RUNNING, 'phase': 'start-up',
        'phase_time': time.time(),
        'step': None, 'reason': None, 'exit_code': None, 'job': job,
    }
    self._seconds = collections.defaultdict(float)  # Since the last report.
    self._reports = collections.deque(maxlen=REPORTS_KEPT)
    # Running totals since training started, sampled (jobs of several
    # workers): [step, time, loops, loops' CPU, stalled, input wait].
    self._totals = collections.defaultdict(float)
    self._samples = (collections.deque(maxlen=SAMPLES_KEPT)
                     if num_workers > 1 else None)
    self.input_wait = input_wait
    self._input_wait_before = 0.0  # Its seconds at the last report.
    self._lock = threading.Lock()
    self._wake = threading.Event()
    self._ended = threading.Event()
    self._thread = None

  @property
  def started(self) -> bool:
    return self._thread is not None or self._last_write is not None

  def start(self, *, step: int, total_steps: int, steps_per_epoch: int,
            num_epochs: int) -> None:
    """Training starts at `step`: the file is written from now on."""
    with self._lock:
      self._fields.update(step=step, total_steps=total_steps,
                          steps_per_epoch=steps_per_epoch,
                          num_epochs=num_epochs, phase='first step')
    if self.path is None or self.started:
      return
    if not self._threaded:
      self._write()
      return
    self._wake.set()  # The first write at once.
    self._stalls = stall_meter.StallMeter()
    self._thread = threading.Thread(target=self._write_until_ended,
                                    daemon=True, name='ctl-worker-status')
    self._thread.start()

  @contextlib.contextmanager
  def phase(self, name: str, step: int | None = None):
    """Times a phase (a loop of steps: 'training', or an action by its
    name); with `step`, the step reached when it ends."""
    with self._lock:
      if not (name == 'training' and self._fields['phase'] == 'first step'):
        self._set_phase(name)
    if name in _WRITTEN_PHASES and name != 'training':
      self._write_soon(MIN_WRITE_SECONDS)
    wall, cpu = time.monotonic(), time.process_time()
    try:
      yield
    finally:
      wall, cpu = time.monotonic() - wall, time.process_time() - cpu
      with self._lock:
        self._seconds[name] += wall
        if name == 'training':
          self._seconds['training_cpu'] += cpu
          first_loop = self._fields['phase'] == 'first step'
          if first_loop:
            self._set_phase('training')
        if step is not None:
          self._fields['step'] = step
      if name == 'training':
        self._sample(wall, cpu)
        if first_loop or not self._threaded:
          self._write_soon(0.0 if first_loop else self._own_write_seconds)

  def _set_phase(self, name: str) -> None:
    """The phase now, and since when (under the lock)."""
    if self._fields['phase'] != name:
      self._fields['phase'], self._fields['phase_time'] = name, time.time()

  def _sample(self, wall: float, cpu: float) -> None:
    """After a loop: adds it to the running totals, and samples them at
    most every SAMPLE_SECONDS (jobs of several workers)."""
    if self._samples is None:
      return
    self._totals['training'] += wall
    self._totals['training_cpu'] += cpu
    now = time.time()
    if self._samples and now - self._samples[-1][1] < SAMPLE_SECONDS:
      return
    stalled = self._stalls.seconds() if self._stalls else 0.0
    # A read of a local variable between loops: about 20 microseconds.
    waited = (self.input_wait.seconds()
              if self.input_wait is not None else 0.0)
    with self._lock:
      self._samples.append([
          self._fields['step'], round(now, 3),
          round(self._totals['training'], 6),
          round(self._totals['training_cpu'], 6), round(stalled, 6),
          round(waited, 6)])
      self._reported = True  # New numbers for the chief's check.
    self._wake.set()

  def report(self, event) -> None:
    """The `worker-status` action: this report's timings, written."""
    logs = event.train_logs or {}
    stalled = self._stalls.seconds() if self._stalls else 0.0
    # A read of a local variable between loops: about 20 microseconds.
    input_wait = (self.input_wait.seconds()
                  if self.input_wait is not None else None)
    with self._lock:
      # All of it, not only the loops': a worker stopped between its loops
      # holds the others up in their next loop's all-reduce.
      self._seconds['stalled'] = stalled - self._stalled_before
      self._stalled_before = stalled
      if input_wait is not None:
        self._seconds['input_wait'] = input_wait - self._input_wait_before
        self._input_wait_before = input_wait
      self._reports.append({
          'step': event.step, 'time': time.time(),
          'steps_per_second': logs.get('steps_per_second'),
          'seconds': {name: round(value, 6)
                      for name, value in self._seconds.items()}})
      self._seconds.clear()
      self._reported = True
    self._write_soon(self._own_write_seconds)
    if self._on_report is not None:  # For metrics.csv, after this action.
      event.worker_timings = self._on_report.take()

  def finish(self, state: str, reason: str | None, exit_code: int) -> None:
    """The run ended: its state, why, and the process's exit code; written
    before this returns (within _FINAL_WRITE_SECONDS)."""
    with self._lock:
      if self._fields['state'] != RUNNING:
        return  # The first end is the one that counts.
      self._fields.update(state=state, reason=reason, exit_code=exit_code)
      self._set_phase(state)
    if self._thread is None:
      if self._last_write is not None:  # One worker: its last write.
        self._write()
      return
    self._ended.set()
    self._wake.set()
    self._thread.join(_FINAL_WRITE_SECONDS)
    self._stalls.stop()

  @contextlib.contextmanager
  def recording(self):
    """Within it, an exception that ends the run is written as its end."""
    try:
      yield self
    except errors.Preempted as error:
      self.finish(STOPPED, f'preempted: {error}', error.exit_code)
      raise
    except errors.CtlError as error:
      self.finish(FAILED, str(error), error.exit_code)
      raise
    except KeyboardInterrupt:
      self.finish(STOPPED, 'Ctrl-C', 130)
      raise
    except Exception as error:
      self.finish(FAILED, f'{type(error).__name__}: {errors.summary(error)}',
                  errors.EXIT_FAILURE)
      raise

  def snapshot(self) -> dict:
    """The file's content now."""
    now = time.time()
    with self._lock:
      fields = dict(self._fields)
      fields['reports'] = list(self._reports)
      if self._samples is not None:
        fields['samples'] = list(self._samples)
    steps_per_epoch = fields.get('steps_per_epoch')
    if fields['step'] is not None and steps_per_epoch:
      fields['epoch'] = max(1, -(-fields['step'] // steps_per_epoch))
    fields['time'] = now
    fields['progress_time'] = now - self._progress_age()
    return fields

  def _write_until_ended(self) -> None:
    """The writer thread: writes at each wake-up and heartbeat, at most
    once a `MIN_WRITE_SECONDS`, and last the end."""
    heartbeat = self._fields['heartbeat_seconds']
    pause = min(MIN_WRITE_SECONDS, heartbeat / 2)
    while True:
      self._wake.wait(heartbeat)
      self._wake.clear()
      # Read before the snapshot: finish() sets the fields, then this.
      ended = self._ended.is_set()
      with self._lock:
        reported, self._reported = self._reported, False
      if self._write() and reported and self._on_report:
        self._on_report()
      if ended:
        return
      self._ended.wait(pause)  # The end cuts the pause short.

  def _write_soon(self, within: float) -> None:
    """Wakes the writer thread; in a job of one worker, writes now unless
    the last write is younger than `within` seconds."""
    if self._thread is not None:
      self._wake.set()
    elif (self._last_write is not None and
          time.monotonic() - self._last_write >= within):
      self._write()

  def _write(self) -> bool:
    """Writes the file now (never fatal); whether it could."""
    self._last_write = time.monotonic()
    try:
      if not self._folder_made:
        storage.makedirs(os.path.dirname(self.path))
        self._folder_made = True
      storage.write_json(self.path, self.snapshot())
      return True
    except Exception as error:  # pylint: disable=broad-except
      logging.log_every_n_seconds(
          logging.WARNING, 'Could not write the status file %s: %s', 600,
          self.path, error)
      return False

