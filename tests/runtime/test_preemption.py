"""Ctrl-C on ctl.main saves like SIGTERM; every stop says why once."""

import re
import signal

import pytest

from ctl import errors
from ctl.runtime import tf_process
import helpers

NOISY = helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py'


def _job(workdir, *overrides):
  return helpers.Watched(helpers.ctl_command(
      f'--config={helpers.DIGITS}:smoke', f'--workdir={workdir}',
      '--config.num_epochs=100000', *overrides))


@pytest.mark.slow
def test_ctrl_c_saves_the_step_reached_and_exits_42(tmp_path):
  job = _job(tmp_path)
  try:
    job.wait_for(r'step \d+/')
    job.process.send_signal(signal.SIGINT)
    assert job.wait() == errors.EXIT_PREEMPTED, job.output[-3000:]
  finally:
    job.kill()
  step = int(re.search(r'Stopped by Ctrl-C after step (\d+)',
                       job.output).group(1))
  assert helpers.latest_checkpoint_step(tmp_path) == step
  # One message, on its own line: not also as a log line.
  assert len(re.findall('Stopped by Ctrl-C after step', job.output)) == 1
  assert re.search(r'^ctl: preempted: Stopped by Ctrl-C', job.output,
                   re.MULTILINE)
  resumed = _job(tmp_path)
  try:
    resumed.wait_for(f'Training from step {step} ')
  finally:
    resumed.kill()


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_without_saving(tmp_path):
  # The task's action holds the job after step 4 until a file appears that
  # this test never writes: the first Ctrl-C's save is still to come when
  # the second Ctrl-C arrives, however slow the machine.
  job = helpers.Watched(helpers.ctl_command(
      f'--config={NOISY}:HeldAtStep4', f'--workdir={tmp_path}',
      '--config.intervals.checkpoint_steps=0'))
  try:
    job.wait_for('Held after step 4 until')
    job.process.send_signal(signal.SIGINT)
    job.wait_for('Ctrl-C again: stop now')
    job.process.send_signal(signal.SIGINT)
    # Held for an hour otherwise: the bound only catches that.
    code = job.wait(timeout=300)
  finally:
    job.kill()
  assert code == tf_process.EXIT_INTERRUPTED, job.output[-3000:]
  assert 'ctl: error: Ctrl-C twice: stopped at once' in job.output
  assert 'Stopped by Ctrl-C' not in job.output
  assert helpers.latest_checkpoint_step(tmp_path) == 0
