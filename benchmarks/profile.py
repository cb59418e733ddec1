"""Where a step's time goes: TensorFlow profiler traces of ctl's loop and
of the compute-only loop, the same steps, op by op.

    # From the repository root:
    python -m benchmarks.profile [--workload=cnn] [--steps=200]

Each contender trains in a process of its own (as in benchmarks/timeslice.py),
traced over `steps` steps after three loops of warm-up: ctl's trainer with
its defaults, and the compute-only loop reading its batches as a training
loop must (a gather from the examples in memory), summing its loss and
updating the task's accuracy (benchmarks/workloads.py). It prints each
one's milliseconds per step in all, then per XLA operation (each run once
a step), side by side.
BENCHMARKS.md, "Where the CNN's time goes", reads from it.
"""

import collections
import glob
import json
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

_WORKLOAD = flags.DEFINE_string('workload', 'cnn', 'mlp or cnn.')
_STEPS = flags.DEFINE_integer('steps', 200, 'Steps traced, a multiple of 100.')
_ROWS = flags.DEFINE_integer('rows', 20, 'Operations shown.')

_WARMUP_LOOPS = 3
# A contender's process takes about a minute; one still running is killed.
_TIMEOUT_SECONDS = 900


def trace(contender: str, workload: str, steps: int) -> dict:
  """In this process: trains `contender` ('ctl' or 'compute'), tracing
  `steps` steps after the warm-up; returns {'total': ms, 'ops': {name: ms}}
  per step."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from benchmarks import workloads
  # pylint: enable=g-import-not-at-top
  loops = steps // 100
  logdir = tempfile.mkdtemp()
  total_steps = 1 + 100 * (_WARMUP_LOOPS + loops + 1)
  # Both report after each loop of 100 steps (ctl: its speed meter's stop;
  # compute: its progress's clock): the trace spans whole loops.
  if contender == 'ctl':
    from ctl.training import report  # pylint: disable=g-import-not-at-top
    clock_owner, clock_name = report.SpeedMeter, 'stop'
    train = workloads.ctl_progress(workload, total_steps)
  else:
    clock_owner, clock_name = workloads.time, 'time'
    train = workloads.compute_only_progress(workload, total_steps, gather=True)
  original = getattr(clock_owner, clock_name)
  calls = [0]

  def clock(*args, **kwargs):
    calls[0] += 1
    if calls[0] == 1 + _WARMUP_LOOPS:
      tf.profiler.experimental.start(logdir)
    value = original(*args, **kwargs)
    if calls[0] == 1 + _WARMUP_LOOPS + loops:
      tf.profiler.experimental.stop()
    return value

  setattr(clock_owner, clock_name, clock)
  try:
    train()
  finally:
    setattr(clock_owner, clock_name, original)
  return _per_step(glob.glob(f'{logdir}/plugins/profile/*/*.xplane.pb')[0],
                   steps)


def _per_step(xplane: str, steps: int) -> dict:
  """Milliseconds per step: the traced span, and each operation run once a
  step (the XLA program's)."""
  # pylint: disable=g-import-not-at-top
  from tensorflow.python.profiler.internal import _pywrap_profiler_plugin
  # pylint: enable=g-import-not-at-top
  data, _ = _pywrap_profiler_plugin.xspace_to_tools_data(
      [xplane], 'trace_viewer@', {})
  events = [event for event in json.loads(data)['traceEvents']
            if event.get('ph') == 'X']
  span = (max(event['ts'] + event['dur'] for event in events) -
          min(event['ts'] for event in events))
  counts, micros = collections.Counter(), collections.Counter()
  for event in events:
    counts[event['name']] += 1
    micros[event['name']] += event['dur']
  return {'total': span / 1e3 / steps,
          'ops': {name: micros[name] / 1e3 / steps for name in micros
                  if counts[name] == steps}}


def main(argv: list[str]) -> None:
  if len(argv) == 3:  # A contender's own process.
    print('TRACE ' + json.dumps(trace(argv[1], _WORKLOAD.value,
                                      _STEPS.value)), flush=True)
    return
  results = {}
  for contender in ('ctl', 'compute'):
    output = subprocess.run(
        [sys.executable, '-m', 'benchmarks.profile', contender, 'trace',
         f'--workload={_WORKLOAD.value}', f'--steps={_STEPS.value}'],
        check=True, capture_output=True, text=True,
        timeout=_TIMEOUT_SECONDS).stdout
    results[contender] = json.loads(output.split('TRACE ', 1)[1])
  ctl, compute = results['ctl'], results['compute']
  print(f'{_WORKLOAD.value}, {_STEPS.value} steps traced: ms per step, ctl '
        f'{ctl["total"]:.2f}, compute only {compute["total"]:.2f} (ratio of '
        f'speeds {compute["total"] / ctl["total"]:.3f})\n')
  print('| operation (once a step) | ctl, ms | compute only, ms |')
  print('| --- | --- | --- |')
  names = sorted(set(ctl['ops']) | set(compute['ops']),
                 key=lambda name: -max(ctl['ops'].get(name, 0),
                                       compute['ops'].get(name, 0)))
  for name in names[:_ROWS.value]:
    print(f'| {name} | {ctl["ops"].get(name, 0):.3f} | '
          f'{compute["ops"].get(name, 0):.3f} |')


if __name__ == '__main__':
  app.run(main)
