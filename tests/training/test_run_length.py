"""A run's cost before its first step does not grow with its length, and
SIGTERM during its start-up is answered."""

import os
import signal
import time

import pytest

import helpers

# How much more memory than a short run's a long run may take at most.
_MEMORY_FACTOR = 1.5


def _resident_bytes(pid: int) -> int:
  """The process's resident memory now (VmRSS; none once it has exited)."""
  with open(f'/proc/{pid}/status') as status:
    for line in status:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) * 1024
  return 0


def _exit_code_and_peak(job: helpers.Watched, bound: float | None,
                        timeout: float) -> tuple[int, int]:
  """Waits for job to exit; its exit code and peak resident bytes (from
  wait4). Fails at once when its memory passes bound, or after timeout
  (a hang)."""
  deadline = time.monotonic() + timeout
  while True:
    pid, status, usage = os.wait4(job.process.pid, os.WNOHANG)
    if pid:
      job.process.returncode = os.waitstatus_to_exitcode(status)
      job.wait()
      return job.process.returncode, usage.ru_maxrss * 1024
    if bound is not None:
      resident = _resident_bytes(job.process.pid)
      assert resident < bound, (
          f'{resident / 2**20:.0f} MiB resident before the end, over '
          f'{bound / 2**20:.0f} MiB:\n{job.output[-3000:]}')
    assert time.monotonic() < deadline, (
        f'not ended {timeout} s after SIGTERM:\n{job.output[-3000:]}')
    time.sleep(0.1)


@pytest.mark.slow
def test_a_long_run_starts_in_the_memory_of_a_short_one_and_answers_sigterm(
    tmp_path):
  # The loops of the run were once planned up front, as Python lists: a
  # billion epochs took tens of GB and never reached the first step. Then
  # each epoch's example order was built whole: an epoch of a trillion
  # steps grew by 13 MB/s and ignored SIGTERM until SIGKILL.
  peaks = {}
  for name, overrides in [
      ('short', ()), ('a billion epochs', ('--config.num_epochs=1000000000',)),
      ('a trillion steps an epoch', ('--config.num_epochs=1',
                                     f'--config.steps_per_epoch={10**12}'))]:
    workdir = tmp_path / name.replace(' ', '_')
    job = helpers.Watched(helpers.ctl_command(
        f'--config={helpers.DIGITS}:smoke', f'--workdir={workdir}',
        *overrides))
    try:
      # Logged as the trainer is built, before the data's pipeline is.
      job.wait_for('XLA compiles', timeout=180)
      job.process.send_signal(signal.SIGTERM)
      bound = _MEMORY_FACTOR * peaks['short'] if peaks else None
      code, peaks[name] = _exit_code_and_peak(job, bound, timeout=180)
      assert code == 42, job.output[-3000:]
      assert helpers.latest_checkpoint_step(workdir) >= 1
    finally:
      job.kill()
  print(f'Peak resident memory of each run: {peaks}')
  for name, peak in peaks.items():
    assert peak < _MEMORY_FACTOR * peaks['short'], (name, peaks)


@pytest.mark.parametrize('override', [
    f'total_steps={2**63 - 1}', f'steps_per_epoch={2**63 - 1}',
    f'steps_per_epoch={10**18}', f'num_epochs={3 * 10**17}',
    f'num_epochs={2 * 10**63}',
    f'num_epochs={2 * 10**17}',  # Only too long with the data's 44 steps.
])
def test_a_run_whose_examples_overflow_int64_is_refused_at_start(
    tmp_path, override):
  # Each once trained, then crashed at its first log line, its data's
  # pipeline (End of sequence) or an OverflowError, after writing the
  # workdir.
  workdir = tmp_path / 'w'
  done = helpers.run_ctl(f'--config={helpers.DIGITS}:smoke',
                         f'--workdir={workdir}', f'--config.{override}')
  output = done.stdout + done.stderr
  assert done.returncode == 2, output[-3000:]
  errors = [line for line in output.splitlines()
            if line.startswith('ctl: error:')]
  assert len(errors) == 1 and 'int64' in errors[0], output[-3000:]
  assert 'Traceback' not in output
  assert not workdir.exists() or not [
      path for path in workdir.rglob('*') if path.is_file()], output[-3000:]


def test_the_eta_of_a_run_longer_than_a_timedelta_is_logged(tmp_path):
  # 10**17 steps of 32 examples fit in int64, but not their time left in
  # a datetime.timedelta: the first log line once raised OverflowError.
  job = helpers.Watched(helpers.ctl_command(
      f'--config={helpers.DIGITS}:smoke', f'--workdir={tmp_path / "w"}',
      f'--config.total_steps={10**17}', '--config.intervals.log_steps=5'))
  try:
    job.wait_for(r'step \d+/100000000000000000 .* ETA over 999999999 days')
    job.process.send_signal(signal.SIGTERM)
    assert job.wait() == 42, job.output[-3000:]
  finally:
    job.kill()
