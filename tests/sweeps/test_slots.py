"""A sweep's warm slots on their own: trial after trial in one real
`python -m ctl.warm` process, replaced past its limits."""

import sys
import time

from ctl import errors
from ctl.sweep import slots as slots_lib
import helpers


def _finish(process, timeout: float = 300) -> int:
  """Polls a trial's process until it ends (bounded); its exit code."""
  deadline = time.monotonic() + timeout
  while process.poll() is None:
    assert time.monotonic() < deadline, 'the trial did not end'
    time.sleep(0.05)
  return process.returncode


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
