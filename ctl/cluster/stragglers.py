"""The straggler line: the chief names a worker that holds the others up,
and what it is slow at.

The all-reduce in every step makes each worker's loop as long as the
slowest's, so a loop's wall time says nothing about which worker is slow.
What differs is each worker's own time in its loops, in two parts:
- its work: its process's CPU time, plus the time it was kept from running
  at all (stopped, or starved of CPU: the status file's StallMeter);
- its input wait: its steps waiting for their batches, timed in the loop's
  graph (ctl/cluster/input_wait.py): a slow tf.data pipeline.
A worker that waits for a slow peer in the all-reduce adds to neither.

At each report the chief (on its status writer's thread, not the
training thread: ctl/cluster/worker_timings.py, which logs the lines)
reads every worker's status file and compares, in each
of the last `reports` reports all of them wrote, each worker's work and
its input wait to the others' (their median): a worker is slow in a
report when either exceeds `factor` times the others' by more than a
fifth of the loops' wall time. A worker slow in every report of the
window is named once: input-bound when its input wait was slow in each of
them and makes up at least half of its excess work (a stopped worker's
stops fall partly in its input reads too), else compute-bound. It is
named again when it recovers (slow in none of them). One stall of a busy
machine does not name a worker.
"""

import statistics

# A straggler must cost at least this share of the loops' wall time: on a
# busy machine every worker is stalled now and then.
_MIN_SHARE_OF_WALL = 0.2

# The parts of a worker's own time compared, what each counts, and what a
# straggler slow at it is.
_PARTS = ('work', 'input')
_WHAT = {'work': 'of CPU and stalls in its loops',
         'input': 'waiting for input in its steps'}
KINDS = {'work': 'compute-bound', 'input': 'input-bound'}
_BOUND = {'work': 'compute-bound (its own work in the steps: CPU time, and '
                  'time it was kept from running)',
          'input': 'input-bound (its steps wait for its input pipeline)'}


class StragglerCheck:
  """The chief's check after each report: a line on each change."""

  def __init__(self, factor: float, reports: int):
    self._factor = factor
    self._reports = reports
    # {index: what it is slow at, 'work' or 'input' (KINDS)}
    self.stragglers: dict[int, str] = {}

  def update(self, statuses: dict[int, dict | None]) -> list[str]:
    """The lines to log for the workers that became or stopped being
    stragglers, given every worker's status."""
    window = self._window(statuses)
    if window is None:
      return []
    lines = []
    for index in sorted(statuses):
      slow = {part: [self._slow(index, times[part], wall)
                     for times, wall in window] for part in _PARTS}
      excess = {part: sum(times[part][index] - _others(index, times[part])
                          for times, _ in window) for part in _PARTS}
      status = statuses[index]
      who = f'worker {index} ({status["host"]}, pid {status["pid"]})'
      if (all(map(any, zip(*slow.values()))) and
          index not in self.stragglers):
        kind = ('input' if all(slow['input']) and
                2 * excess['input'] >= excess['work'] else 'work')
        self.stragglers[index] = kind
        lines.append(f'Straggler: {who} is {_BOUND[kind]}: '
                     f'{self._numbers(index, kind, window)}. Every worker '
                     'waits for it at each all-reduce.')
      elif (not any(map(any, zip(*slow.values()))) and
            index in self.stragglers):
        kind = self.stragglers.pop(index)
        lines.append(f'{who.capitalize()} is no longer a straggler: '
                     f'{self._numbers(index, kind, window)}.')
    return lines

  def _numbers(self, index: int, part: str, window) -> str:
    """A worker's seconds of one part over the window, and the others'."""
    mine = sum(times[part][index] for times, _ in window)
    others = sum(_others(index, times[part]) for times, _ in window)
    return (f'{mine:.2f} s {_WHAT[part]} over the last {self._reports} '
            f'reports, against {others:.2f} s for the others')

  def _slow(self, index: int, own: dict[int, float], wall: float) -> bool:
    """Whether a worker's seconds (of one part) held the others up in one
    report."""
    others = _others(index, own)
    return (own[index] > self._factor * others and
            own[index] - others > _MIN_SHARE_OF_WALL * wall)

  def _window(self, statuses) -> list[tuple[dict[str, dict[int, float]],
                                            float]] | None:
    """For each of the last reports every worker wrote: each part's seconds
    of each worker ({'work': {index: s}, 'input': ...}), and the loops'
    wall time (the chief's); None before there are enough."""
    if any(status is None for status in statuses.values()):
      return None
    by_step = {index: {report['step']: report['seconds']
                       for report in status.get('reports', [])}
               for index, status in statuses.items()}
    common = sorted(set.intersection(*(set(reports)
                                       for reports in by_step.values())))
    steps = common[-self._reports:]
    if len(steps) < self._reports:
      return None
    chief = by_step[min(by_step)]
    return [({'work': {index: reports[step].get('training_cpu', 0.0) +
                              reports[step].get('stalled', 0.0)
                       for index, reports in by_step.items()},
              'input': {index: reports[step].get('input_wait', 0.0)
                        for index, reports in by_step.items()}},
             chief[step].get('training', 0.0)) for step in steps]


def _others(index: int, own: dict[int, float]) -> float:
  """The other workers' median."""
  return statistics.median(value for other, value in own.items()
                           if other != index)


def from_config(config) -> StragglerCheck | None:
  """The check as config.diagnostics sets it; None for none (and for a
  config without the section)."""
  if config is None or not config.straggler_factor:
    return None
  return StragglerCheck(config.straggler_factor, config.straggler_reports)

