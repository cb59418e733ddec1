"""The cost of preemption: parameter servers against all-reduce (issue 51).

    python -m benchmarks.bench --sections=preemption

Two jobs of the digits CNN (configs/digits.py, 32 examples a worker a
step), each started by `ctl.launch` on this machine and run twice: once
as it is, once with one worker killed (SIGKILL) every --preemption_kill_every_secs
seconds, for --preemption_window_secs seconds each:
  parameter servers: a chief, NUM_WORKERS workers and 1 server
    (`--num_ps=1`); the launcher starts a killed worker again and the chief
    runs its steps on the others meanwhile;
  all-reduce: NUM_WORKERS MultiWorkerMirrored workers; a kill stops the
    job, and the launcher restarts every worker from the latest checkpoint.
Both save a checkpoint every CHECKPOINT_SECONDS (the all-reduce job loses
at most that much work a kill) and run STEPS_PER_LOOP steps a loop, with a
log line at each loop's end.

What is measured: the step of the job's chief (its log line's `step N/M`,
its `Training from step N` after a restart) as the benchmark reads the
launcher's output, timestamped on arrival. The window starts at the
chief's first log line, so the start-up before it (processes, imports,
tracing) is left out of every run alike; steps per second of wall time
are the steps gained from there to the window's end, over its seconds.
Kills come at every multiple of the kill interval into the window (before
its end), each taking the worker a seeded draw names (never the chief of
the parameter-server job; in the all-reduce job worker 0 is its chief,
and may be drawn). Once the all-reduce job is killed, its step is the
latest checkpoint's (`Saved .../ckpt-N`: where the restart resumes) until
the restarted job logs again. The same seed gives both jobs the same
kills. After the window, the run waits (bounded) for the launcher's line
for each kill (a worker, or the job, started again), then kills the
launcher, whose tasks die with it.
"""

from collections.abc import Callable
import contextlib
import dataclasses
import math
import os
import pathlib
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

_REPO = pathlib.Path(__file__).resolve().parents[1]
NUM_WORKERS = 4
PER_WORKER_BATCH = 32
STEPS_PER_LOOP = 64
CHECKPOINT_SECONDS = 10.0
KINDS = {'parameter_servers': 'parameter servers (a chief, {n} workers, '
                              '1 server)',
         'all_reduce': 'all-reduce (MultiWorkerMirrored, {n} workers)'}
# Bounds of every wait: to the chief's first log line (6 TensorFlow
# processes starting on 2 cores take a minute or two), then after the
# window for the launcher's restart lines, then for the tasks to be gone.
_FIRST_STEP_TIMEOUT_SECONDS = 400.0
_RESTART_LINES_TIMEOUT_SECONDS = 120.0
_EXIT_TIMEOUT_SECONDS = 30.0
_STEP_LINE = re.compile(r'\] (?:step (\d+)/\d+ epoch|Training from step (\d+) '
                        r'to )')
_SAVED_LINE = re.compile(r'\] Saved \S+-(\d+)$')
_PIDS_LINE = re.compile(r'^\[launch\] attempt \d+: started workers with pids '
                        r'\[([\d, ]+)\]')
_RESTARTED_LINE = re.compile(
    r'^\[launch\] attempt \d+: (?:(worker \d+) exited with -?\d+; started '
    r'again .* with pid (\d+)|workers exited with .*; restarting)')


@dataclasses.dataclass(frozen=True)
class Job:
  """One of the two jobs: kind, a key of KINDS; its workers."""

  kind: str
  num_workers: int = NUM_WORKERS
  checkpoint_seconds: float = CHECKPOINT_SECONDS

  @property
  def parameter_servers(self) -> bool:
    return self.kind == 'parameter_servers'

  def task_names(self) -> list[str]:
    """The launcher's tasks, in the order of its pids line."""
    workers = [f'worker {index}' for index in range(self.num_workers)]
    return ['chief', *workers, 'ps 0'] if self.parameter_servers else workers

  def chief(self) -> str:
    return 'chief' if self.parameter_servers else 'worker 0'

  def batch_size(self) -> int:
    """config.batch_size: a step's examples (one worker's with parameter
    servers; every worker's with all-reduce)."""
    return PER_WORKER_BATCH * (1 if self.parameter_servers else
                               self.num_workers)

  def command(self, workdir: str) -> list[str]:
    """The launcher's command: the job, endless for the window (one epoch
    of a million steps: no evaluation)."""
    overrides = {
        'batch_size': self.batch_size(), 'num_epochs': 1,
        'steps_per_epoch': 1_000_000, 'steps_per_loop': STEPS_PER_LOOP,
        'intervals.log_steps': STEPS_PER_LOOP,
        'intervals.summary_steps': STEPS_PER_LOOP,
        'intervals.checkpoint_epochs': 0,
        'intervals.checkpoint_secs': self.checkpoint_seconds}
    if self.parameter_servers:
      overrides['distribution.strategy'] = 'parameter_server'
    return [sys.executable, '-m', 'ctl.launch',
            f'--num_workers={self.num_workers}',
            *(['--num_ps=1'] if self.parameter_servers else []),
            '--max_restarts=100', '--',
            f'--config={_REPO / "configs" / "digits.py"}',
            f'--workdir={workdir}',
            *(f'--config.{key}={value}' for key, value in overrides.items())]


@dataclasses.dataclass(frozen=True)
class Schedule:
  """When kills come (seconds into the window) and which worker each takes."""

  window_seconds: float
  kill_every_seconds: float = math.inf
  kills: tuple[tuple[float, int], ...] = ()

  @classmethod
  def seeded(cls, seed: int, num_workers: int, window_seconds: float,
             kill_every_seconds: float) -> 'Schedule':
    """A kill at every multiple of kill_every_seconds before the window's
    end, each of a worker drawn from seed."""
    draw = random.Random(seed)
    count = int((window_seconds - 1e-9) // kill_every_seconds)
    return cls(window_seconds, kill_every_seconds, tuple(
        (kill_every_seconds * (index + 1), draw.randrange(num_workers))
        for index in range(count)))


@dataclasses.dataclass
class Run:
  """What one run measured: its chief's step at the window's start and
  end, the kills (seconds into the window, task, pid) and the launcher's
  lines that started a worker or the job again."""

  job: Job
  window_seconds: float
  first_step: int
  last_step: int
  kills: list[tuple[float, str, int]]
  restarts: list[str]

  @property
  def steps_per_second(self) -> float:
    return (self.last_step - self.first_step) / self.window_seconds


class Progress:
  """The job's step, from its chief's lines; where a kill of an all-reduce
  job leaves it (the latest checkpoint) until the job logs again."""

  def __init__(self, job: Job):
    self._prefix = f'[{job.chief()}] '
    self._whole_job_stops = not job.parameter_servers
    self.step = None  # None: no step line yet.
    self.logged = False  # Whether a log line of a step came.
    self.stopped = False  # Killed, not started again yet.
    self._saved = 0

  def read(self, line: str) -> None:
    """Takes in one line of the launcher's output."""
    if _PIDS_LINE.match(line):
      self.stopped = False  # An attempt of new processes.
    if not line.startswith(self._prefix):
      return
    saved = _SAVED_LINE.search(line)
    if saved:
      self._saved = int(saved[1])
    found = _STEP_LINE.search(line)
    if self.stopped:
      self.step = self._saved  # A killed attempt's late lines do not count.
    elif found:
      self.step = int(found[1] or found[2])
      self.logged |= found[1] is not None

  def killed(self) -> None:
    """A worker was killed: an all-reduce job goes back to its checkpoint."""
    if self._whole_job_stops:
      self.stopped = True
      self.step = self._saved


def run_all(seed: int, window_seconds: float, kill_every_seconds: float,
            log: Callable[[str], None]) -> tuple[Schedule, dict]:
  """Each job without kills, then with the seeded kills; returns the
  schedule and {(kind, killed): Run}."""
  schedule = Schedule.seeded(seed, NUM_WORKERS, window_seconds,
                             kill_every_seconds)
  log(f'[bench] preemption: seed {seed}; kills at '
      f'{_kills_text(schedule.kills)} s into each window of '
      f'{window_seconds:g} s')
  runs = {}
  with tempfile.TemporaryDirectory() as root:
    for kind in KINDS:
      for killed in (False, True):
        directory = os.path.join(root, f'{kind}-{"killed" if killed else "whole"}')
        os.makedirs(directory)
        runs[kind, killed] = run = measure(
            Job(kind), directory,
            schedule if killed else Schedule(window_seconds))
        log(f'[bench] preemption: {kind}, {"killed" if killed else "no kills"}'
            f': {run.steps_per_second:.2f} steps/s (steps {run.first_step} to '
            f'{run.last_step}), kills {run.kills}, {len(run.restarts)} '
            'restart line(s)')
  return schedule, runs


def ratio(runs: dict, kind: str) -> float:
  """Steps per second of the job of kind with kills over without."""
  whole = runs[kind, False].steps_per_second
  return runs[kind, True].steps_per_second / whole if whole > 0 else math.nan


def table(schedule: Schedule, seed: int, runs: dict) -> str:
  """The section's text: a row a run, and the ratios."""
  lines = [
      '### The cost of preemption: a worker killed every '
      f'{schedule.kill_every_seconds:g} s',
      '', f'The digits CNN, {PER_WORKER_BATCH} examples a worker a step, '
      f'{STEPS_PER_LOOP} steps a loop, a checkpoint every '
      f'{CHECKPOINT_SECONDS:g} s; steps per second of wall time over '
      f'{schedule.window_seconds:g} s from the chief\'s first log line '
      f'(benchmarks/preemption.py). Seed {seed}: kills at '
      f'{_kills_text(schedule.kills)} s into the window.', '',
      '| job | run | steps/s | examples/s | steps (first to last) | kills (s '
      'into the window: task) | restart lines |',
      '| --- | --- | --- | --- | --- | --- | --- |']
  for (kind, killed), run in runs.items():
    chief = 'worker 0' if kind == 'all_reduce' else None
    kills = '; '.join(
        f'{seconds:.1f}: {name}' + (' (its chief)' if name == chief else '')
        for seconds, name, _ in run.kills) or '-'
    lines.append(
        f'| {KINDS[kind].format(n=run.job.num_workers)} | '
        f'{"killed" if killed else "no kills"} | '
        f'{run.steps_per_second:.2f} | '
        f'{run.steps_per_second * run.job.batch_size():,.0f} | '
        f'{run.first_step} to {run.last_step} | {kills} | '
        f'{len(run.restarts)} |')
  lines += ['', 'Steps per second with kills / without: parameter servers '
            f'{ratio(runs, "parameter_servers"):.3g}x, all-reduce '
            f'{ratio(runs, "all_reduce"):.3g}x.']
  return '\n'.join(lines)


def _kills_text(kills) -> str:
  """'30 (worker 2), 60 (worker 0)'."""
  return ', '.join(f'{seconds:g} (worker {victim})'
                   for seconds, victim in kills) or 'none'


def measure(job: Job, directory: str, schedule: Schedule) -> Run:
  """Runs job with schedule's kills, its workdir and the launcher's output
  (launch.log) in directory. Raises RuntimeError when the job ends or its
  first log line is late."""
  progress = Progress(job)
  with _on_sigterm_raise(), _Launched(job, directory) as launched:
    launched.follow(progress, time.monotonic() + _FIRST_STEP_TIMEOUT_SECONDS,
                    until_logged=True)
    start, first_step = launched.last_time, progress.step
    kills = []
    for seconds, victim in schedule.kills:
      launched.follow(progress, start + seconds)
      name = f'worker {victim}'
      pid = launched.kill(name, progress, start + schedule.window_seconds)
      if pid is not None:
        kills.append((time.monotonic() - start, name, pid))
    launched.follow(progress, start + schedule.window_seconds)
    last_step = progress.step
    launched.follow(progress,
                    time.monotonic() + _RESTART_LINES_TIMEOUT_SECONDS,
                    until_restarts=len(kills))
  return Run(job, schedule.window_seconds, first_step, last_step, kills,
             launched.restarts)


class _Launched:
  """ctl.launch running a job: its output lines as they come, timestamped,
  each task's pid and the launcher's restart lines. On exit the launcher is
  killed, and its tasks with it (they die with their parent:
  ctl/runtime/subprocesses.py)."""

  def __init__(self, job: Job, directory: str):
    self._job = job
    self._workdir = os.path.join(directory, 'workdir')
    self._log_path = os.path.join(directory, 'launch.log')
    self._lines = queue.Queue()  # (arrival, line); line None at the end.
    self._pending = None  # A line that came after a follow's deadline.
    self._process = None
    self._log = None
    self._reader = None
    self.pids = {}  # The latest process of each task.
    self.seen = set()  # Every task process ever started.
    self.restarts = []
    self.last_time = None  # Of the last line followed.

  def __enter__(self) -> '_Launched':
    from ctl.runtime import subprocesses  # pylint: disable=g-import-not-at-top
    # This checkout's ctl, in the launcher and the tasks it starts.
    path = os.pathsep.join(filter(None, [str(_REPO),
                                         os.environ.get('PYTHONPATH')]))
    self._process = subprocesses.start(
        self._job.command(self._workdir), stdout=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=path))
    self._log = open(self._log_path, 'w')  # pylint: disable=consider-using-with
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()
    return self

  def _read(self) -> None:
    """Puts each line of the launcher's output in the queue, and the log."""
    for line in self._process.stdout:
      self._lines.put((time.monotonic(), line.rstrip('\n')))
      self._log.write(line)
      self._log.flush()
    self._lines.put((time.monotonic(), None))

  def follow(self, progress: Progress, deadline: float, *,
             until_logged: bool = False, until_restarts: int | None = None
             ) -> None:
    """Reads lines until deadline, or sooner: until_logged, until the
    chief's first log line of a step (RuntimeError if the deadline comes
    first); until_restarts, until that many restart lines. RuntimeError if
    the launcher ends."""
    while not (until_logged and progress.logged or
               until_restarts is not None and
               len(self.restarts) >= until_restarts):
      line = self._next_line(deadline)
      if line is None:
        if until_logged:
          self._fail(f'no log line of a step within '
                     f'{_FIRST_STEP_TIMEOUT_SECONDS:.0f} s')
        return
      progress.read(line)
      self._note(line)

  def _next_line(self, deadline: float) -> str | None:
    """The next line that came by deadline; None once it passed."""
    if self._pending is None:
      try:
        self._pending = self._lines.get(
            timeout=max(0.0, deadline - time.monotonic()))
      except queue.Empty:
        return None
    arrival, line = self._pending
    if arrival > deadline:
      return None  # Kept for the next follow.
    self._pending = None
    if line is None:
      self._fail('the launcher ended with '
                 f'{self._process.wait(timeout=_EXIT_TIMEOUT_SECONDS)}')
    self.last_time = arrival
    return line

  def _note(self, line: str) -> None:
    """Keeps the tasks' pids and the restart lines."""
    self._note_pids(line)
    if _RESTARTED_LINE.match(line):
      self.restarts.append(line)

  def _note_pids(self, line: str) -> None:
    """Keeps the pids of the tasks a line of the launcher says it started."""
    started = _PIDS_LINE.match(line)
    if started:
      pids = [int(pid) for pid in started[1].split(',')]
      self.pids = dict(zip(self._job.task_names(), pids))
      self.seen.update(pids)
    restarted = _RESTARTED_LINE.match(line)
    if restarted and restarted[1]:  # One worker of a parameter-server job.
      self.pids[restarted[1]] = int(restarted[2])
      self.seen.add(int(restarted[2]))

  def kill(self, name: str, progress: Progress, deadline: float
           ) -> int | None:
    """SIGKILLs task name's process. While it is not running, or the job
    restarts after a kill, the new one is waited for until deadline (then
    None)."""
    while True:
      pid = self.pids.get(name)
      if not progress.stopped and _running(pid):
        with contextlib.suppress(ProcessLookupError):  # Exited just now.
          os.kill(pid, signal.SIGKILL)
          progress.killed()
          return pid
      line = self._next_line(deadline)
      if line is None:
        return None
      progress.read(line)
      self._note(line)

  def _fail(self, why: str) -> None:
    with open(self._log_path) as log:
      tail = log.read()[-3000:]
    raise RuntimeError(f'{self._job.kind} job: {why}; its output (in '
                       f'{self._log_path}) ends:\n{tail}')

  def __exit__(self, *exc_info) -> None:
    if self._process.poll() is None:
      self._process.kill()
    self._process.wait(timeout=_EXIT_TIMEOUT_SECONDS)
    self._reader.join(timeout=_EXIT_TIMEOUT_SECONDS)
    self._log.close()
    while not self._lines.empty():  # Tasks started since the last follow.
      line = self._lines.get()[1]
      if line is not None:
        self._note_pids(line)
    deadline = time.monotonic() + _EXIT_TIMEOUT_SECONDS
    while any(_running(pid) for pid in self.seen):
      if time.monotonic() > deadline:
        for pid in filter(_running, self.seen):
          if _is_ctl_main(pid):  # Not a process that took its pid since.
            os.kill(pid, signal.SIGKILL)  # Its parent's death did not.
        break
      time.sleep(0.1)


def _running(pid: int | None) -> bool:
  """Whether pid is a process that has not exited (a zombie has)."""
  if pid is None:
    return False
  try:
    with open(f'/proc/{pid}/stat') as stat:
      state = stat.read().rsplit(')', 1)[1].split()[0]
  except (OSError, IndexError):
    return False
  return state not in ('Z', 'X')


def _is_ctl_main(pid: int) -> bool:
  """Whether process pid runs ctl.main."""
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as cmdline:
      return b'ctl.main' in cmdline.read()
  except OSError:
    return False


@contextlib.contextmanager
def _on_sigterm_raise():
  """SIGTERM to this process raises SystemExit, so that the launcher and
  its tasks are cleaned up on the way out (main thread only)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handle(signum, frame):
    del frame
    raise SystemExit(128 + signum)

  previous = signal.signal(signal.SIGTERM, handle)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)
