"""The straggler line: the chief names a worker that holds the others up.

The all-reduce in every step makes each worker's loop as long as the
slowest's, so a loop's wall time says nothing about which worker is slow.
What differs is each worker's own work in its loops: its process's CPU
time, plus the time it was kept from running at all (stopped, or starved
of CPU: worker_status.StallMeter). A worker that waits for a slow peer
adds neither. Input read inside the loop's graph (a task's tf.data
pipeline) counts as the step's own work: ctl cannot tell it apart there.

At each report the chief (on its status writer's thread, not the
training thread) reads every worker's status file and compares their own
work in each of the last `reports` reports all of them wrote: a worker
whose work exceeds `factor` times the others' (their median), by more
than a fifth of the loops' wall time, in every one of them is named once;
it is named again when it recovers (slow in none of them). One stall of
a busy machine does not name a worker.
"""

import statistics

from absl import logging

from ctl.cluster import worker_status

# A straggler must cost at least this share of the loops' wall time: on a
# busy machine every worker is stalled now and then.
_MIN_SHARE_OF_WALL = 0.2


class StragglerCheck:
  """The chief's check after each report; logs a line on each change."""

  def __init__(self, workdir: str, num_workers: int, factor: float,
               reports: int):
    self._workdir = workdir
    self._num_workers = num_workers
    self._factor = factor
    self._reports = reports
    self.stragglers: set[int] = set()

  def __call__(self) -> None:
    statuses = worker_status.read_peers(self._workdir, self._num_workers)
    for line in self.update(statuses):
      logging.warning('%s', line)

  def update(self, statuses: dict[int, dict | None]) -> list[str]:
    """The lines to log for the workers that became or stopped being
    stragglers, given every worker's status."""
    window = self._window(statuses)
    if window is None:
      return []
    lines = []
    for index in sorted(statuses):
      slow = [self._slow(index, own, wall) for own, wall in window]
      mine = sum(own[index] for own, _ in window)
      others = sum(_others(index, own) for own, _ in window)
      status = statuses[index]
      who = f'worker {index} ({status["host"]}, pid {status["pid"]})'
      numbers = (f'{mine:.2f} s of CPU and stalls in its loops over the '
                 f'last {self._reports} reports, against {others:.2f} s for '
                 'the others')
      if all(slow) and index not in self.stragglers:
        self.stragglers.add(index)
        lines.append(
            f'Straggler: {who} is compute-bound (its own work in the steps, '
            f'input read in the step included): {numbers}. Every worker '
            'waits for it at each all-reduce.')
      elif not any(slow) and index in self.stragglers:
        self.stragglers.discard(index)
        lines.append(f'{who.capitalize()} is no longer a straggler: '
                     f'{numbers}.')
    return lines

  def _slow(self, index: int, own: dict[int, float], wall: float) -> bool:
    """Whether a worker held the others up in one report."""
    others = _others(index, own)
    return (own[index] > self._factor * others and
            own[index] - others > _MIN_SHARE_OF_WALL * wall)

  def _window(self, statuses) -> list[tuple[dict[int, float], float]] | None:
    """For each of the last reports every worker wrote: each worker's own
    seconds, and the loops' wall time (the chief's); None before there
    are enough."""
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
    return [({index: reports[step].get('training_cpu', 0.0) +
                     reports[step].get('stalled', 0.0)
              for index, reports in by_step.items()},
             chief[step].get('training', 0.0)) for step in steps]


def _others(index: int, own: dict[int, float]) -> float:
  """The other workers' median."""
  return statistics.median(value for other, value in own.items()
                           if other != index)


def from_config(config, workdir: str, is_chief: bool,
                num_workers: int) -> StragglerCheck | None:
  """The chief's check, as config.diagnostics sets it; None for none (and
  for a config without the section)."""
  if (config is None or not is_chief or num_workers < 2 or
      not config.straggler_factor):
    return None
  return StragglerCheck(workdir, num_workers, config.straggler_factor,
                        config.straggler_reports)

