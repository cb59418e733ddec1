"""The straggler line: the chief names a worker that holds the others up,
and what it is slow at.

The all-reduce in every step makes each worker's loop as long as the
slowest's, so a loop's wall time says nothing about which worker is slow.
What differs is each worker's own time in its steps, in two parts:
- its work: its process's CPU time in its loops, plus the time it was kept
  from running at all (stopped, or starved of CPU: the status file's
  StallMeter);
- its input wait: its steps waiting for their batches, timed in the loop's
  graph (ctl/cluster/input_wait.py): a slow tf.data pipeline.
A worker that waits for a slow peer in the all-reduce adds to neither.

Each worker's status file samples its running totals of them after its
loops, at most every worker_status.SAMPLE_SECONDS (`samples`). After each
of its writes the chief (on its status writer's thread, not the training
thread: ctl/cluster/worker_timings.py, which logs the lines) reads every
file and splits the last `seconds` of each worker's samples, by that
worker's clock, in two halves of at least `seconds / 2` each. In each half
it compares each worker's work per step and input wait per step to the
others' (their median): a worker is slow in a half when either exceeds
`factor` times the others' by more than a fifth of the half's time. A
worker slow in both halves is named once (one stall of a busy machine
falls in one half): input-bound when its input wait was slow in both and
makes up at least half of its excess work (a stopped worker's stops fall
partly in its input reads too), else compute-bound. It is named again
when it recovers (slow in neither).

Time, not reports: the check holds whatever the report interval
(`intervals.log_steps`), and names a worker at half speed about `seconds`
and a write after it slowed, as long as its loops of steps end more often
than every `seconds / 2`.
"""

import statistics

# A straggler must cost at least this share of the time: on a busy machine
# every worker is stalled now and then.
_MIN_SHARE_OF_TIME = 0.2

# The parts of a worker's own time compared, what each counts, and what a
# straggler slow at it is.
_PARTS = ('work', 'input')
_WHAT = {'work': 'of CPU and stalls in its loops',
         'input': 'waiting for input in its steps'}
KINDS = {'work': 'compute-bound', 'input': 'input-bound'}
_BOUND = {'work': 'compute-bound (its own work in the steps: CPU time, and '
                  'time it was kept from running)',
          'input': 'input-bound (its steps wait for its input pipeline)'}

# A sample's fields (worker_status.WorkerStatus._sample): running totals.
_STEP, _TIME, _LOOPS, _CPU, _STALLED, _INPUT = range(6)


class StragglerCheck:
  """The chief's check after each write: a line on each change."""

  def __init__(self, factor: float, seconds: float):
    self._factor = factor
    self._seconds = seconds
    # {index: what it is slow at, 'work' or 'input' (KINDS)}
    self.stragglers: dict[int, str] = {}

  def update(self, statuses: dict[int, dict | None]) -> list[str]:
    """The lines to log for the workers that became or stopped being
    stragglers, given every worker's status."""
    halves = _halves(statuses, self._seconds)
    if halves is None:
      return []
    lines = []
    for index in sorted(halves):
      slow = {part: [self._slow(index, part, half, halves)
                     for half in (0, 1)] for part in _PARTS}
      status = statuses[index]
      who = f'worker {index} ({status["host"]}, pid {status["pid"]})'
      if all(map(any, zip(*slow.values()))) and index not in self.stragglers:
        excess = {part: sum(_excess(index, part, half, halves)
                            for half in (0, 1)) for part in _PARTS}
        kind = ('input' if all(slow['input']) and
                2 * excess['input'] >= excess['work'] else 'work')
        self.stragglers[index] = kind
        lines.append(f'Straggler: {who} is {_BOUND[kind]}: '
                     f'{_numbers(index, kind, halves)}. Every worker '
                     'waits for it at each all-reduce.')
      elif (not any(map(any, zip(*slow.values()))) and
            index in self.stragglers):
        kind = self.stragglers.pop(index)
        lines.append(f'{who.capitalize()} is no longer a straggler: '
                     f'{_numbers(index, kind, halves)}.')
    return lines

  def _slow(self, index: int, part: str, half: int, halves) -> bool:
    """Whether a worker's time per step (of one part) held the others up
    in one half of the window."""
    mine = halves[index][half]
    others = _others_per_step(index, part, half, halves)
    return (mine[part] > self._factor * others * mine['steps'] and
            _excess(index, part, half, halves) >
            _MIN_SHARE_OF_TIME * mine['seconds'])


def _halves(statuses, seconds: float) -> dict[int, list[dict]] | None:
  """{index: [older half, newer half]} of each worker's last samples, each
  half's steps, seconds, work and input wait; None before every worker
  has enough, or while a peer's file is an earlier run's."""
  if any(status is None or not status.get('samples')
         for status in statuses.values()):
    return None
  since = statuses[min(statuses)]['started']
  halves = {}
  for index, status in statuses.items():
    samples = status['samples']
    if samples[-1][_TIME] < since:
      return None
    newest = samples[-1]
    middle = _sample_before(samples, newest[_TIME] - seconds / 2)
    oldest = middle and _sample_before(samples, middle[_TIME] - seconds / 2)
    if oldest is None or not (oldest[_STEP] < middle[_STEP] < newest[_STEP]):
      return None
    halves[index] = [_between(oldest, middle), _between(middle, newest)]
  return halves


def _sample_before(samples: list[list], moment: float) -> list | None:
  """The last sample taken at or before a moment."""
  earlier = [sample for sample in samples if sample[_TIME] <= moment]
  return earlier[-1] if earlier else None


def _between(first: list, last: list) -> dict[str, float]:
  """The steps, seconds and each part's seconds from one sample to
  another."""
  return {'steps': last[_STEP] - first[_STEP],
          'seconds': last[_TIME] - first[_TIME],
          'work': (last[_CPU] + last[_STALLED]) - (first[_CPU] +
                                                   first[_STALLED]),
          'input': last[_INPUT] - first[_INPUT]}


def _others_per_step(index: int, part: str, half: int, halves) -> float:
  """The other workers' median seconds of one part per step."""
  return statistics.median(
      values[half][part] / values[half]['steps']
      for other, values in halves.items() if other != index)


def _excess(index: int, part: str, half: int, halves) -> float:
  """A worker's seconds of one part in a half beyond the others' for as
  many steps."""
  mine = halves[index][half]
  return mine[part] - _others_per_step(index, part, half,
                                       halves) * mine['steps']


def _numbers(index: int, part: str, halves) -> str:
  """A worker's seconds of one part over the window, and the others' for
  as many steps."""
  mine = sum(half[part] for half in halves[index])
  others = mine - sum(_excess(index, part, half, halves) for half in (0, 1))
  span = sum(half['seconds'] for half in halves[index])
  steps = sum(half['steps'] for half in halves[index])
  return (f'{mine:.2f} s {_WHAT[part]} over its last {span:.1f} s '
          f'({steps} steps), against {others:.2f} s for the others')


def from_config(config) -> StragglerCheck | None:
  """The check as config.diagnostics sets it; None for none (and for a
  config without the section)."""
  if config is None or not config.straggler_factor:
    return None
  return StragglerCheck(config.straggler_factor, config.straggler_seconds)
