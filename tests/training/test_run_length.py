"""A run's cost before its first step does not grow with its length."""

import signal

import pytest

import helpers


def _peak_resident_bytes(pid: int) -> int:
  """The process's peak resident memory so far (VmHWM)."""
  with open(f'/proc/{pid}/status') as status:
    for line in status:
      if line.startswith('VmHWM:'):
        return int(line.split()[1]) * 1024
  raise AssertionError('no VmHWM in /proc status')


@pytest.mark.slow
def test_memory_before_the_first_step_does_not_grow_with_num_epochs(
    tmp_path):
  # The loops of the run were once planned up front, as Python lists: a
  # billion epochs took tens of GB and never reached the first step.
  peaks = {}
  for num_epochs in (1000, 10**9):
    job = helpers.Watched(helpers.ctl_command(
        f'--config={helpers.DIGITS}:smoke',
        f'--workdir={tmp_path / str(num_epochs)}',
        f'--config.num_epochs={num_epochs}'))
    try:
      job.wait_for('First step done', timeout=180)
      peaks[num_epochs] = _peak_resident_bytes(job.process.pid)
      job.process.send_signal(signal.SIGTERM)
      assert job.wait(timeout=120) == 42, job.output[-3000:]
    finally:
      job.kill()
  print(f'Peak resident memory at the first step: {peaks}')
  assert peaks[10**9] < 1.2 * peaks[1000], peaks
