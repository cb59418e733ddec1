"""What the chief makes of every worker's status file at each report.

After each write of its own status file (on its writer thread, never the
training thread) the chief reads every worker's file once, and
- runs the straggler check (ctl/cluster/stragglers.py), which logs its line;
- takes each report that every worker has written since the last look and
  writes each worker's phase timings in it, in milliseconds spent since the
  report before:

      workers/<i>/loops_ms        its loops of steps (wall time)
      workers/<i>/work_ms         its CPU time in them, plus the time it was
                                  kept from running (stopped, starved)
      workers/<i>/input_wait_ms   its steps waiting for their input
      workers/<i>/checkpoint_ms   saving checkpoints
      workers/<i>/evaluate_ms     evaluating
      workers/<i>/actions_ms      every other action (the log line, ...)

  to TensorBoard at once (the `workers` run: workdir/workers/, beside the
  status files; under the report's step), and,
  through the next report's event (`Event.worker_timings`), to metrics.csv
  (config.log_csv; under the report's step too).

The numbers travel in the status files the workers write anyway (no
collective, no extra write): a file is rewritten at most once a second,
so a report's timings reach the chief up to a second or so later, and
metrics.csv gets them with a later report. The reports after the last
one the chief saw of every worker are in TensorBoard only.
"""

import collections
import threading

from absl import logging

from ctl.cluster import stragglers as stragglers_lib
from ctl.cluster import peer_evidence
from ctl.metric_writers import tensorboard
from ctl.runtime import workdir as workdir_lib

# The phases named on their own; every other action's time is `actions_ms`.
_OWN_NAMES = {'training': 'loops_ms', 'input_wait': 'input_wait_ms',
              'checkpoint': 'checkpoint_ms', 'evaluate': 'evaluate_ms'}
# Seconds in a report that are parts of a loop's, not phases.
_PARTS_OF_LOOPS = ('training_cpu', 'stalled')


def phase_milliseconds(seconds: dict[str, float]) -> dict[str, float]:
  """A report's seconds by phase, as the timings' names and milliseconds."""
  timings = collections.defaultdict(float)
  timings['work_ms'] = 1000 * (seconds.get('training_cpu', 0.0) +
                               seconds.get('stalled', 0.0))
  for name, value in seconds.items():
    if name not in _PARTS_OF_LOOPS:
      timings[_OWN_NAMES.get(name, 'actions_ms')] += 1000 * value
  return {name: round(value, 3) for name, value in sorted(timings.items())}


class WorkerTimings:
  """The chief's look at every worker's status after each of its reports."""

  def __init__(self, workdir: str, num_workers: int,
               stragglers: stragglers_lib.StragglerCheck | None):
    self._workdir = workdir
    self._num_workers = num_workers
    self._stragglers = stragglers
    self._written = -1  # The last report's step written.
    self._writer = None  # The chief's TensorBoard writer, made at need.
    self._pending = {}  # {step: timings} for the next report's event.
    self._lock = threading.Lock()

  def __call__(self) -> None:
    """After the chief's write of its status: one read of every file."""
    statuses = peer_evidence.read_peers(self._workdir, self._num_workers)
    if self._stragglers is not None:
      for line in self._stragglers.update(statuses):
        logging.warning('%s', line)
    new = self.update(statuses)
    if not new:
      return
    if self._writer is None:
      self._writer = tensorboard.TensorBoardWriter(
          workdir_lib.workers_dir(self._workdir))
    for step, timings in new.items():
      self._writer.write_scalars(step, timings)
    with self._lock:
      self._pending.update(new)

  def update(self, statuses: dict[int, dict | None]) -> dict[int, dict]:
    """{step: {'workers/<i>/<phase>_ms': milliseconds}} of the reports
    every worker wrote that are new since the last call."""
    if any(status is None for status in statuses.values()):
      return {}
    # A peer's file from an earlier run in the workdir (not yet rewritten
    # by this run's worker) holds reports older than the chief's start.
    since = statuses[min(statuses)]['started']
    by_step = {index: {report['step']: report['seconds']
                       for report in status.get('reports', [])
                       if report['time'] >= since}
               for index, status in statuses.items()}
    common = set.intersection(*(set(reports) for reports in by_step.values()))
    new = {}
    for step in sorted(step for step in common if step > self._written):
      new[step] = {f'workers/{index}/{name}': value
                   for index in sorted(by_step)
                   for name, value in phase_milliseconds(
                       by_step[index][step]).items()}
      self._written = step
    return new

  def take(self) -> dict[int, dict[str, float]]:
    """The timings gathered since the last take (for metrics.csv)."""
    with self._lock:
      taken, self._pending = self._pending, {}
    return taken


def from_config(config, workdir: str, is_chief: bool,
                num_workers: int) -> WorkerTimings | None:
  """The chief's timings, with its straggler check as config.diagnostics
  sets it; None on other workers and in a job of one."""
  if not is_chief or num_workers < 2:
    return None
  return WorkerTimings(workdir, num_workers,
                       stragglers_lib.from_config(config))
