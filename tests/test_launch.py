"""The launcher's decisions, and a launch that a restart cannot fix."""

import contextlib
import json
import os
import signal
import time

import pytest

from ctl import launch
import helpers


@pytest.mark.parametrize('codes, expected', [
    ([0, 0], 0),
    ([42, 42], 42),  # Preempted: restart.
    ([42, 0], 42),
    ([43, -9], 43),  # A worker was killed, the other lost it: restart.
    ([42, 43], 43),
    ([1, 43], 1),  # A real failure: a restart would fail again.
    ([2, 2], 2),
])
def test_job_exit_code(codes, expected):
  assert launch.job_exit_code(codes) == expected


def test_tf_configs_name_distinct_localhost_ports():
  configs = [json.loads(config) for config in launch.tf_configs(3)]
  workers = configs[0]['cluster']['worker']
  assert len(set(workers)) == 3
  assert all(worker.startswith('localhost:') for worker in workers)
  assert [config['task'] for config in configs] == [
      {'type': 'worker', 'index': index} for index in range(3)]
  assert all(config['cluster'] == configs[0]['cluster'] for config in configs)


def test_a_config_error_is_not_restarted(tmp_path):
  launcher = helpers.Watched([
      *helpers.ctl_command()[:2], 'ctl.launch', '--num_workers=2', '--',
      f'--config={helpers.DIGITS}', f'--workdir={tmp_path / "w"}',
      '--config.no_such_key=1'])
  assert launcher.wait() == 2
  assert 'workers exited with [2, 2]; giving up: a restart cannot fix it' in (
      launcher.output)
  assert launcher.output.count('started workers') == 1
  assert '[worker 1] ctl: error: Unknown config key' in launcher.output


def _launch_a_long_job(workdir: str) -> helpers.Watched:
  """ctl.launch of 2 workers, training far longer than a test waits."""
  return helpers.Watched([
      *helpers.ctl_command()[:2], 'ctl.launch', '--num_workers=2', '--',
      f'--config={helpers.DIGITS}', f'--workdir={workdir}',
      '--config.num_epochs=50'])


@pytest.mark.slow
def test_workers_die_with_a_killed_launcher(tmp_path):
  workdir = str(tmp_path / 'job')
  launcher = _launch_a_long_job(workdir)
  launcher.wait_for(r'\[worker 0\] .*step \d+/')
  launcher.process.send_signal(signal.SIGKILL)
  launcher.wait()
  deadline = time.monotonic() + 10
  while helpers.processes_mentioning(workdir):
    assert time.monotonic() < deadline, 'workers outlived their launcher'
    time.sleep(0.1)


@pytest.mark.slow
def test_a_second_ctrl_c_stops_the_workers_at_once_with_130(tmp_path):
  workdir = str(tmp_path / 'job')
  launcher = _launch_a_long_job(workdir)
  try:
    launcher.wait_for(r'\[worker 0\] .*step \d+/')
    launcher.process.send_signal(signal.SIGINT)
    launcher.wait_for(r'\[worker \d\] .*Received SIGTERM')
    launcher.process.send_signal(signal.SIGINT)
    # As ctl.main's second Ctrl-C, not 43 for the workers it killed.
    assert launcher.wait() == 130, launcher.output[-3000:]
  finally:
    launcher.kill()
  assert 'Ctrl-C twice: stopped at once, without saving' in launcher.output
  assert not helpers.processes_mentioning(workdir)


@pytest.mark.slow
def test_workers_left_after_the_grace_are_killed_with_one_line(tmp_path):
  # Its loop once said so again every 0.1 s until the killed were gone:
  # three lines in a row.
  workdir = str(tmp_path / 'job')
  launcher = helpers.Watched([
      *helpers.ctl_command()[:2], 'ctl.launch', '--num_workers=2',
      '--stop_grace_secs=0', '--max_restarts=0', '--',
      f'--config={helpers.DIGITS}', f'--workdir={workdir}',
      '--config.num_epochs=50'])
  try:
    pids = json.loads(launcher.wait_for(
        r'started workers with pids (\[.*\])').group(1))
    launcher.wait_for(r'\[worker 0\] .*step \d+/')
    # Worker 0, stopped, cannot leave by itself when it sees its peer gone
    # (it did so within 0.1 s once, before the launcher looked: no line).
    os.kill(pids[0], signal.SIGSTOP)
    os.kill(pids[1], signal.SIGKILL)
    assert launcher.wait() == 43, launcher.output[-3000:]
  finally:
    launcher.kill()
    # A stopped worker would outlive a launcher killed half-way.
    for pid in helpers.processes_mentioning(workdir):
      with contextlib.suppress(ProcessLookupError):  # Gone meanwhile.
        os.kill(pid, signal.SIGKILL)
  assert launcher.output.count('killing workers') == 1, launcher.output[-3000:]
  assert 'workers exited with [-9, -9]' in launcher.output
