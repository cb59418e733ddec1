"""One measurement in a process of its own.

    python -m benchmarks.isolated benchmarks.tfrecord:ctl_speed '{"directory": "/tmp/shards"}'

calls `benchmarks.tfrecord.ctl_speed(directory=...)`, which builds a
contender and returns a function that measures it, calls that once and
prints `BENCH {"steps_per_second": ...}`.

The sections whose target is parity with a hand-written loop (user_task,
tfrecord) measure every contender so. In one process, what was built first
ran faster than what was built later: the TFRecord section's hand-written
loop, built once at the start, ran 12% faster than the same loop built
afresh in each repetition after ctl's runs (medians of 5), so the contender
built once was favoured over ctl's run, which is new every repetition. In
processes of their own, each measuring a fresh run's second half, both
start equal.
"""

import importlib
import json
import sys


def main(argv: list[str]) -> None:
  if len(argv) not in (2, 3):
    raise SystemExit(__doc__)
  module_name, _, function_name = argv[1].partition(':')
  kwargs = json.loads(argv[2]) if len(argv) == 3 else {}
  measure = getattr(importlib.import_module(module_name), function_name)(
      **kwargs)
  print('BENCH ' + json.dumps({'steps_per_second': measure()}), flush=True)


if __name__ == '__main__':
  main(sys.argv)
