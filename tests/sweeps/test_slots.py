"""A sweep's warm slots on their own: trial after trial in one real
`python -m ctl.warm` process, replaced past its limits."""

import csv
import json
import sys
import time

import pytest

from ctl import errors
from ctl import hyper
from ctl.sweep import slots as slots_lib
from ctl.sweep import trials as trials_lib
import helpers


def _finish(process, timeout: float = 300) -> int:
  """Polls a trial's process until it ends (bounded); its exit code."""
  deadline = time.monotonic() + timeout
  while process.poll() is None:
    assert time.monotonic() < deadline, 'the trial did not end'
    time.sleep(0.05)
  return process.returncode


@pytest.mark.slow  # Two slots, each a process that imports TensorFlow.
def test_a_slot_runs_trial_after_trial_until_its_limit_then_a_fresh_one(
    tmp_path):
  # Trials that fail at once (no such config): a slot's cost is its start.
  processes = slots_lib.TrialProcesses(
      1, slots_lib.SlotLimits(trials=2, memory_mb=10**6))
  command = (sys.executable, '-m', 'ctl.main',
             f'--config={tmp_path / "missing.py"}',
             f'--workdir={tmp_path / "w"}')
  pids, slot = [], None
  try:
    for number in range(3):
      with open(tmp_path / f'log{number}.txt', 'a') as log:
        log.write('=== the runner\'s header\n')
        log.flush()
        process = processes.start(command, log)
        assert _finish(process) == errors.EXIT_USAGE
        slot = process.slot
        assert processes.finished(process) == {'pid': process.pid,
                                                'warm': True}
        pids.append(process.pid)
      text = (tmp_path / f'log{number}.txt').read_text()
      assert text.startswith('=== the runner\'s header\n'), text  # Appended.
      assert 'ctl: error:' in text, text
    # Two trials in the first slot, then a fresh one (SlotLimits.trials).
    assert pids[0] == pids[1] != pids[2], pids
    assert slot.process.poll() is None  # Kept: it ran one trial.
    assert slot.usable(slots_lib.SlotLimits(trials=2, memory_mb=10**6))
    assert not slot.usable(slots_lib.SlotLimits(trials=2, memory_mb=1))
    assert 100 < slots_lib.resident_mb(slot.process.pid) < 10**6

    # A run the slot refuses (one of a cluster) runs in a process of its own.
    with open(tmp_path / 'refused.txt', 'a') as log:
      process = processes.start(
          (sys.executable, '-m', 'ctl.main', f'--config={helpers.DIGITS}',
           f'--workdir={tmp_path / "w"}',
           '--config.distribution.strategy=multi_worker'), log)
      assert _finish(process) == errors.EXIT_USAGE
      assert process.pid != slot.process.pid
      assert processes.finished(process) == {'pid': process.pid,
                                              'warm': False}
    text = (tmp_path / 'refused.txt').read_text()
    assert '(not run warm: it is a multi-worker run' in text, text
    assert 'ctl: error: distribution.strategy=' in text, text
  finally:
    processes.close()
  assert slot.process.returncode == 0  # Ended at the end of its input.


@pytest.mark.slow  # A sweep of two trials, each in a slot of its own.
def test_a_sweep_replaces_a_slot_whose_memory_grew_past_the_bound(tmp_path):
  # --slot_memory_mb=1: every slot is past it after its first trial, so
  # each trial gets a fresh slot (with the default 4096 MiB, one slot ran
  # them all); the sweep still finishes every trial. Two trials show the
  # replacement (a third would show it again, at a TensorFlow start's cost).
  trials = hyper.product(
      hyper.fixed({'total_steps': 3, 'model.filters': 4, 'model.width': 8,
                   'export.at_end': False}),
      hyper.sweep('optimizer.learning_rate', [0.001, 0.01]))
  sweep_file = tmp_path / 'memory_sweep.py'
  sweep_file.write_text(
      'from ctl import hyper\n\n'
      'def get_sweep():\n'
      f'  return hyper.Sweep(config={helpers.DIGITS!r}, trials={trials!r},\n'
      '                     metric="eval.accuracy")\n')
  workdir = tmp_path / 'sweep'
  run = helpers.Watched([sys.executable, '-m', 'ctl.sweep',
                         f'--sweep={sweep_file}', f'--workdir={workdir}',
                         '--parallel=1', '--slot_memory_mb=1'])
  assert run.wait() == 0, run.output[-3000:]
  with open(workdir / 'results.csv', newline='') as file:
    assert [row['status'] for row in csv.DictReader(file)] == [
        'finished'] * 2
  records = [json.loads((workdir / name / 'trial.json').read_text())
             for name in trials_lib.trial_names(trials)]
  assert [record['warm'] for record in records] == [True] * 2, records
  assert len({record['pid'] for record in records}) == 2, records
