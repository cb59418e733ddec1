"""The watchdog that bounds every wait for a peer, in a real process.

Across workers it is tested where it matters: a stopped worker and one
stuck in Python (tests/training/test_preemption.py). Here one process
shows what counts as progress: steps the graph counts, beats, paused work.
"""

import re
import subprocess
import sys

import pytest

import helpers

# 1 s: long enough that another test's processes on the same cores (the
# suite runs two files at a time) do not hold a step back for a timeout.
TIMEOUT_SECONDS = 1.0

# Steps, beats and a pause, each lasting three timeouts; then nothing.
PROGRAM = f"""
import time
import tensorflow as tf
from ctl.cluster import watchdog as watchdog_lib

TIMEOUT = {TIMEOUT_SECONDS}

@tf.function
def step(watchdog):
  watchdog.steps.assign_add(1)

def for_three_timeouts(work):
  end = time.monotonic() + 3 * TIMEOUT
  while time.monotonic() < end:
    work()
    time.sleep(TIMEOUT / 5)

watchdog = watchdog_lib.Watchdog(TIMEOUT)
step(watchdog)  # Traced before the watchdog counts.
with watchdog:
  for_three_timeouts(lambda: step(watchdog))
  print('steps done', flush=True)
  for_three_timeouts(watchdog.beat)
  print('beats done', flush=True)
  with watchdog.paused():
    time.sleep(3 * TIMEOUT)
  print('pause done', flush=True)
  time.sleep(60)
  print('not stopped', flush=True)
"""


@pytest.mark.slow
def test_only_a_stall_aborts_and_a_stall_outside_tensorflow_exits():
  run = subprocess.run([sys.executable, '-c', PROGRAM], cwd=helpers.REPO,
                       env=helpers.env_with(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
  assert run.returncode == 43, run.stdout[-3000:]
  events = [match.group(0) for match in re.finditer(
      r'steps done|beats done|pause done|No progress for 1 s|'
      r'ctl: error: This worker made no progress for 2 s|not stopped',
      run.stdout)]
  assert events == [
      'steps done', 'beats done', 'pause done', 'No progress for 1 s',
      'ctl: error: This worker made no progress for 2 s']
