"""Two contenders measured in turns, for targets near parity.

This machine's speed swings by 10-20% from one second to the next (a pure
Python loop here, timed second by second, ranges from 840 to 1,440
iterations), so two runs measured one after the other differ by up to 15%
however they are ordered. So each contender runs in a process of its own,
both started at once, and they take turns: the one whose turn it is runs
for `window_seconds` while the other is stopped (SIGSTOP, every thread of
it, its tf.data threads included), then they swap, until both are done.
Each reports its progress, (steps trained, wall time) after each loop; a
window's speed is the steps between the first and last of its reports
inside the window over the time between them (the process ran throughout).
Windows in the second half of a run are measured, as ctl's own speed is,
and each ratio compares two adjacent windows: seconds apart, under the same
load. Fresh processes also keep what one contender left behind (threads,
memory) from slowing the other: in one process, a hand-written loop built
before ctl's runs ran 12% faster than the same loop built after them.

A contender is a function `benchmarks.module:name` that takes JSON keyword
arguments and returns a function that trains and returns its progress;
`python -m benchmarks.timeslice MODULE:FUNCTION JSON` runs one (it is how
the processes are started) and prints `PROGRESS [[steps, time], ...]`.
"""

import dataclasses
import importlib
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

_REPO = pathlib.Path(__file__).resolve().parents[1]

Progress = list[tuple[int, float]]  # (steps trained, time.time()) per loop.


@dataclasses.dataclass(frozen=True)
class Window:
  """A contender's turn: [start, end] in time.time()."""

  contender: str
  start: float
  end: float


def run_in_turns(contenders: dict[str, tuple[str, dict]],
                 window_seconds: float = 2.0,
                 timeout_seconds: float = 900.0
                 ) -> tuple[list[Window], dict[str, Progress]]:
  """Runs each contender, (function, kwargs), in a process of its own, the
  processes taking turns of window_seconds, the first named first.

  Returns:
    The turns, in order, and each contender's progress.

  Raises:
    RuntimeError: a process failed, or all took longer than timeout_seconds
      (they are killed).
  """
  with tempfile.TemporaryDirectory() as scratch:
    processes, outputs = {}, {}
    # A SIGTERM to this process unwinds through the finally below: the
    # contenders, one of them stopped, must not outlive it.
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
      for name, (function, kwargs) in contenders.items():
        # Output to files: a stopped reader of a full pipe would stall them.
        outputs[name] = open(os.path.join(scratch, f'{len(outputs)}.log'),  # pylint: disable=consider-using-with
                             'w+')
        processes[name] = subprocess.Popen(
            [sys.executable, '-m', 'benchmarks.timeslice', function,
             json.dumps(kwargs)], stdout=outputs[name],
            stderr=subprocess.STDOUT, cwd=_REPO)
        if len(processes) > 1:
          processes[name].send_signal(signal.SIGSTOP)
      windows = _take_turns(processes, window_seconds,
                            time.monotonic() + timeout_seconds)
    finally:
      signal.signal(signal.SIGTERM, previous_handler)
      for process in processes.values():
        if process.poll() is None:
          process.send_signal(signal.SIGCONT)
          process.kill()
          process.wait()
    progress = {}
    for name, process in processes.items():
      outputs[name].seek(0)
      text = outputs[name].read()
      outputs[name].close()
      found = re.search(r'^PROGRESS (.*)$', text, re.M)
      if process.returncode or not found:
        raise RuntimeError(f'{contenders[name][0]} failed (exit '
                           f'{process.returncode}):\n{text[-3000:]}')
      progress[name] = [tuple(point) for point in json.loads(found.group(1))]
  return windows, progress


def _exit_on_sigterm(signum, frame) -> None:
  del frame
  raise SystemExit(128 + signum)


def _take_turns(processes: dict[str, subprocess.Popen], window_seconds: float,
                deadline: float) -> list[Window]:
  """Lets each running process run for window_seconds in turn, the others
  stopped, until all have exited."""
  windows = []
  running = list(processes)
  turn = 0
  while running:
    if time.monotonic() > deadline:
      raise RuntimeError(f'{", ".join(running)} still running at the '
                         'deadline.')
    name = running[turn % len(running)]
    process = processes[name]
    process.send_signal(signal.SIGCONT)
    start = time.time()
    try:
      process.wait(timeout=window_seconds)
      running.remove(name)  # Its successor takes the turn after this one.
    except subprocess.TimeoutExpired:
      process.send_signal(signal.SIGSTOP)
      turn += 1
    windows.append(Window(name, start, time.time()))
  return windows


def window_speeds(windows: list[Window], progress: dict[str, Progress],
                  ) -> list[float | None]:
  """Each window's steps per second, None where it is not measured: in the
  first half of its contender's run, or with fewer than two reports."""
  speeds = []
  for window in windows:
    points = progress[window.contender]
    half = points[-1][0] / 2
    inside = [(steps, when) for steps, when in points
              if window.start <= when <= window.end]
    if len(inside) < 2 or inside[0][0] < half:
      speeds.append(None)
    else:
      (first_steps, first_time), (last_steps, last_time) = inside[0], inside[-1]
      speeds.append((last_steps - first_steps) / (last_time - first_time))
  return speeds


def paired_ratios(windows: list[Window], speeds: list[float | None],
                  mine: str, theirs: str) -> list[float]:
  """mine's speed over theirs in each two adjacent measured windows."""
  ratios = []
  for (a, speed_a), (b, speed_b) in zip(zip(windows, speeds),
                                        zip(windows[1:], speeds[1:])):
    if speed_a and speed_b and {a.contender, b.contender} == {mine, theirs}:
      ratios.append(speed_a / speed_b if a.contender == mine else
                    speed_b / speed_a)
  return ratios


@dataclasses.dataclass
class Comparison:
  """What rounds of run_in_turns measured."""

  speeds: dict[str, list[float]]  # Each measured window's steps/s.
  # (a, b) -> a's speed over b's in adjacent windows, for each two
  # contenders, a named before b.
  pairs: dict[tuple[str, str], list[float]]

  @property
  def ratios_to(self) -> dict[str, list[float]]:
    """The first contender over each other one."""
    mine = next(iter(self.speeds))
    return {b: ratios for (a, b), ratios in self.pairs.items() if a == mine}

  @property
  def ratios(self) -> list[float]:
    """The first contender over the second."""
    return next(iter(self.ratios_to.values()))

  @property
  def ratio(self) -> float:
    return statistics.median(self.ratios)

  def ratio_to(self, other: str) -> float:
    """The first contender over other."""
    return self.ratio_between(next(iter(self.speeds)), other)

  def ratio_between(self, mine: str, other: str) -> float:
    """mine over other (mine named first); NaN where no two windows were
    paired (runs too short)."""
    ratios = self.pairs[mine, other]
    return statistics.median(ratios) if ratios else float('nan')


def compare(contenders: dict[str, tuple[str, dict]], rounds: int,
            window_seconds: float = 2.0, log=print) -> Comparison:
  """Runs rounds of the contenders in turns, each round started by the next
  one; the ratios are each contender over each named after it (logged: the
  first over each other one)."""
  names = list(contenders)
  speeds = {name: [] for name in names}
  pairs = {(a, b): [] for i, a in enumerate(names) for b in names[i + 1:]}
  for round_ in range(rounds):
    shift = round_ % len(names)
    order = names[shift:] + names[:shift]
    windows, progress = run_in_turns(
        {name: contenders[name] for name in order}, window_seconds)
    measured = window_speeds(windows, progress)
    for window, speed in zip(windows, measured):
      if speed:
        speeds[window.contender].append(speed)
    medians = []
    for mine, other in pairs:
      round_ratios = paired_ratios(windows, measured, mine, other)
      pairs[mine, other] += round_ratios
      if mine == names[0]:
        medians.append(
            f'{statistics.median(round_ratios):.3f} ({len(round_ratios)} '
            'pairs)' if round_ratios else 'none measured: runs too short?')
    log(f'[bench] round {round_ + 1}/{rounds}: median ratio '
        f'{", ".join(medians)}')
  return Comparison(speeds, pairs)


def python_loop_progress(total_steps: int = 2000,
                         steps_per_loop: int = 10) -> Callable[[], Progress]:
  """A contender without TensorFlow, for tests and to see the machine's own
  swings: "steps" of summing 10,000 integers in Python."""
  def train() -> Progress:
    progress = []
    for end in range(steps_per_loop, total_steps + 1, steps_per_loop):
      for _ in range(steps_per_loop):
        sum(range(10_000))
      progress.append((end, time.time()))
    return progress

  return train


def main(argv: list[str]) -> None:
  if len(argv) not in (2, 3):
    raise SystemExit(__doc__)
  module_name, _, function_name = argv[1].partition(':')
  kwargs = json.loads(argv[2]) if len(argv) == 3 else {}
  train = getattr(importlib.import_module(module_name), function_name)(
      **kwargs)
  print('PROGRESS ' + json.dumps(train()), flush=True)


if __name__ == '__main__':
  main(sys.argv)
