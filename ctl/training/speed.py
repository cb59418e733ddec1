"""How fast training goes: loop timing, steady speed, ETA, start-up time."""

import os
import time

import ctl


class SpeedMeter:
  """Times train loops; the first (it traces the functions) is left out."""

  def __init__(self, clock=time.monotonic):
    self._clock = clock
    self._loop_started = 0.0
    self._steps = 0  # Since the last steps_per_second().
    self._seconds = 0.0
    self._loop_ends = []  # (steps trained, time) after each loop.
    self._first = None  # (steps, seconds) of the first loop, until read.

  def start(self) -> None:
    self._loop_started = self._clock()

  def stop(self, num_steps: int) -> bool:
    """Records a loop of num_steps steps; returns whether it was the first."""
    now = self._clock()
    first = not self._loop_ends
    trained = num_steps + (self._loop_ends[-1][0] if self._loop_ends else 0)
    self._loop_ends.append((trained, now))
    if first:
      self._first = (num_steps, now - self._loop_started)
    else:
      self._steps += num_steps
      self._seconds += now - self._loop_started
    return first

  def steps_per_second(self) -> float | None:
    """Training speed since the last call, inside train loops only; the
    first loop's (its tracing included) when it is all there was (a
    resumed run's first report may follow its first loop alone)."""
    steps, seconds = (self._steps, self._seconds) if self._seconds else (
        self._first or (0, 0.0))
    self._steps, self._seconds, self._first = 0, 0.0, None
    return steps / seconds if seconds else None

  def steady_steps_per_second(self) -> float | None:
    """Speed over the second half of the steps trained, periodic work included.

    By then every function has been traced once (the first report, eval and
    save each trace one); a long run is dominated by this speed.
    """
    if len(self._loop_ends) < 2:
      return None
    trained, now = self._loop_ends[-1]
    half = next(end for end in self._loop_ends if end[0] >= trained / 2)
    if half[0] == trained:
      half = self._loop_ends[-2]
    return (trained - half[0]) / (now - half[1])

  def eta_seconds(self, step: int, total_steps: int) -> float | None:
    """Time left at the pace since the first loop, evaluations included."""
    if len(self._loop_ends) < 2:
      return None
    (first_steps, first_time), (steps, _) = (self._loop_ends[0],
                                             self._loop_ends[-1])
    pace = (self._clock() - first_time) / (steps - first_steps)
    return pace * (total_steps - step)


# Longer than Python takes to start and import ctl: a process older than
# that ran something else first.
_INTERPRETER_START_SECONDS = 10.0


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

