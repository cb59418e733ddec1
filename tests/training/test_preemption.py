"""Preemption with real processes and real signals: nothing lost, bit-identical.

Every run here uses one config in deterministic mode, with dropout (so the
random layers' state must be checkpointed too), a log line and a checkpoint
after every step (so a kill often lands while a checkpoint is written), and
is compared with an uninterrupted run of the same config.
"""

import os
import random
import re
import signal
import time

import pytest

from ctl import errors
import helpers

pytestmark = pytest.mark.slow

TIMEOUT_SECONDS = 15
NOISY = helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py'
STEPS_PER_EPOCH = 20
TOTAL_STEPS = 3 * STEPS_PER_EPOCH
ARGS = (f'--config={helpers.DIGITS}', '--config.num_epochs=3',
        f'--config.steps_per_epoch={STEPS_PER_EPOCH}',
        '--config.deterministic=True', '--config.model.dropout=0.3',
        '--config.intervals.log_steps=1', '--config.intervals.checkpoint_steps=2',
        '--config.intervals.keep_checkpoints=2',
        f'--config.distribution.timeout_seconds={TIMEOUT_SECONDS}')


def _start(workdir, num_workers=1) -> list[helpers.Watched]:
  envs = (helpers.cluster_envs(num_workers) if num_workers > 1 else
          [helpers.env_with()])
  return [helpers.Watched(helpers.ctl_command(*ARGS, f'--workdir={workdir}'),
                          env) for env in envs]


def _finish(workdir, num_workers=1) -> str:
  """Runs the job to the end; returns the fingerprint all workers agree on."""
  workers = _start(workdir, num_workers)
  codes = [worker.wait() for worker in workers]
  assert codes == [0] * num_workers, workers[0].output[-3000:]
  fingerprints = [helpers.fingerprint(worker.output)[-1] for worker in workers]
  assert len(set(fingerprints)) == 1
  return fingerprints[0]


def _mid_epoch_step(epoch: int | None = None) -> int:
  """A random step in the first half of epoch 0 or 1."""
  epoch = random.randrange(2) if epoch is None else epoch
  return STEPS_PER_EPOCH * epoch + random.randrange(3, STEPS_PER_EPOCH // 2)


def _resumed_from(output: str) -> int:
  return int(re.search(rf'Training from step (\d+) to {TOTAL_STEPS}',
                       output).group(1))


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  """Fingerprints of uninterrupted runs: {num_workers: sha256}."""
  return {
      num_workers: _finish(tmp_path_factory.mktemp(f'reference{num_workers}'),
                           num_workers)
      for num_workers in (1, 2)
  }


def test_sigterm_saves_the_step_reached_and_resumes_bit_identical(
    tmp_path, uninterrupted):
  target = _mid_epoch_step()
  worker, code, attempt = helpers.sigterm_after(
      lambda attempt: _start(tmp_path / str(attempt))[0],
      rf'step {target}/{TOTAL_STEPS} ', TOTAL_STEPS)
  workdir = tmp_path / str(attempt)
  assert code == errors.EXIT_PREEMPTED, worker.output[-3000:]
  stopped = int(re.search(r'Stopped by SIGTERM after step (\d+)',
                          worker.output).group(1))
  assert stopped > target  # SIGTERM came mid-epoch, at step target.
  assert helpers.latest_checkpoint_step(workdir) == stopped

  [resumed] = _start(workdir)
  assert resumed.wait() == 0, resumed.output[-3000:]
  assert _resumed_from(resumed.output) == stopped
  # The first step trained after the resume is the one after the stop.
  first_step = re.search(rf'step (\d+)/{TOTAL_STEPS} ',
                         resumed.output).group(1)
  assert int(first_step) == stopped + 1
  assert helpers.fingerprint(resumed.output) == [uninterrupted[1]]


def test_sigkill_at_random_moments_loses_nothing_and_resumes_bit_identical(
    tmp_path, uninterrupted):
  # Checkpoints are written every other step, so kills often hit a save.
  resume_at = 0
  for _ in range(3):
    [worker] = _start(tmp_path)
    worker.wait_for(rf'Training from step {resume_at} to ')
    worker.wait_for(
        rf'step {resume_at + random.randrange(1, 15)}/{TOTAL_STEPS} ')
    time.sleep(random.uniform(0.0, 0.05))
    worker.process.send_signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    # The newest complete checkpoint is the one the next run resumes from.
    resume_at = helpers.latest_checkpoint_step(tmp_path)
  [final] = _start(tmp_path)
  assert final.wait() == 0, final.output[-3000:]
  assert _resumed_from(final.output) == resume_at
  assert helpers.fingerprint(final.output) == [uninterrupted[1]]


def test_sigterm_to_one_worker_stops_both_at_one_step_bit_identical(
    tmp_path, uninterrupted):
  workers, workdir = _sigterm_worker_1_mid_epoch(tmp_path)
  stopped = {int(step) for worker in workers for step in re.findall(
      r'Stopped by SIGTERM after step (\d+)', worker.output)}
  assert len(stopped) == 1
  [stopped] = stopped
  assert helpers.latest_checkpoint_step(workdir) == stopped
  assert 'Took part in saving checkpoint' in workers[1].output

  resumed = _start(workdir, num_workers=2)
  assert [worker.wait() for worker in resumed] == [0, 0]
  for worker in resumed:
    assert _resumed_from(worker.output) == stopped
    assert helpers.fingerprint(worker.output) == [uninterrupted[2]]


def _sigterm_worker_1_mid_epoch(tmp_path, attempts=3):
  """Sends SIGTERM to worker 1 of 2 at a random mid-epoch step.

  On a loaded machine the test may read the step's log line so late that
  the job finishes before the signal takes effect: both workers then
  rightly exit 0, with everything saved. That attempt is repeated in a new
  workdir; a job that ignores SIGTERM fails every attempt.

  Returns:
    The stopped workers and their workdir.
  """
  for attempt in range(attempts):
    workdir = tmp_path / f'attempt{attempt}'
    target = _mid_epoch_step()
    workers = _start(workdir, num_workers=2)
    workers[1].wait_for(rf'step {target}/{TOTAL_STEPS} ')
    workers[1].process.send_signal(signal.SIGTERM)
    codes = [worker.wait() for worker in workers]
    # A SIGTERM during the last loop also lets the job finish, rightly.
    finished_first = codes == [0, 0] and not any(
        'Stopped by SIGTERM' in worker.output for worker in workers)
    if not finished_first:
      assert codes == [errors.EXIT_PREEMPTED] * 2, workers[1].output[-3000:]
      return workers, workdir
  raise AssertionError(f'The job finished before SIGTERM in all {attempts} '
                       'attempts')


@pytest.mark.parametrize('victim', [0, 1])
def test_sigkill_of_one_worker_fails_the_other_fast_and_resumes_bit_identical(
    tmp_path, uninterrupted, victim):
  workers = _start(tmp_path, num_workers=2)
  workers[victim].wait_for(rf'step {_mid_epoch_step()}/{TOTAL_STEPS} ')
  killed_at = time.monotonic()
  workers[victim].process.send_signal(signal.SIGKILL)
  survivor = workers[1 - victim]
  assert survivor.wait() == errors.EXIT_PEER_FAILED
  assert time.monotonic() - killed_at < TIMEOUT_SECONDS + 20
  assert 'restart every worker' in survivor.output
  workers[victim].wait()
  latest = helpers.latest_checkpoint_step(tmp_path)

  resumed = _start(tmp_path, num_workers=2)
  assert [worker.wait() for worker in resumed] == [0, 0]
  for worker in resumed:
    assert _resumed_from(worker.output) == latest
    assert helpers.fingerprint(worker.output) == [uninterrupted[2]]


def test_a_hung_worker_fails_the_other_within_the_timeout(tmp_path):
  workers = _start(tmp_path, num_workers=2)
  workers[1].wait_for(rf'step \d+/{TOTAL_STEPS} ')
  hung_at = time.monotonic()
  workers[1].process.send_signal(signal.SIGSTOP)
  try:
    assert workers[0].wait() == errors.EXIT_PEER_FAILED
    assert time.monotonic() - hung_at < TIMEOUT_SECONDS + 20
    assert 'Lost the other workers' in workers[0].output
  finally:
    workers[1].kill()


def test_a_worker_stuck_in_python_fails_both_and_no_thread_is_left_per_step(
    tmp_path):
  # Worker 1 stops for an hour in a task's own Python after step 12, where
  # no collective of TensorFlow waits: worker 0 waits for it in the next
  # step's all-reduce and fails within the timeout; worker 1's watchdog
  # cannot end a wait that is not TensorFlow's, so it exits after twice it.
  workers = [helpers.Watched(helpers.ctl_command(
      f'--config={NOISY}:HangsInPython', f'--workdir={tmp_path}',
      '--config.num_epochs=1', '--config.intervals.checkpoint_steps=0',
      f'--config.distribution.timeout_seconds={TIMEOUT_SECONDS}'), env)
             for env in helpers.cluster_envs(2)]
  try:
    workers[0].wait_for(r'step 12/')
    stuck_at = time.monotonic()
    assert workers[0].wait(timeout=TIMEOUT_SECONDS + 60) == (
        errors.EXIT_PEER_FAILED)
    assert time.monotonic() - stuck_at < TIMEOUT_SECONDS + 20
    assert 'Lost the other workers' in workers[0].output
    assert workers[1].wait(timeout=2 * TIMEOUT_SECONDS + 60) == (
        errors.EXIT_PEER_FAILED)
    assert time.monotonic() - stuck_at > 2 * TIMEOUT_SECONDS
    assert 'ctl: error: This worker made no progress' in workers[1].output
  finally:
    for worker in workers:
      worker.kill()
  # TensorFlow's own collective timeout left a thread behind each
  # collective for the whole timeout (ctl/cluster/watchdog.py): a worker
  # held more threads after every step. Now the count stays put.
  for worker in range(2):
    threads = dict(line.split() for line in (
        tmp_path / f'threads-{worker}.txt').read_text().splitlines())
    assert int(threads['12']) - int(threads['4']) < 4, threads


def test_launcher_restarts_a_job_sigtermed_twice_to_the_same_weights(
    tmp_path, uninterrupted):
  launcher = helpers.Watched([
      *helpers.ctl_command()[:2], 'ctl.launch', '--num_workers=2',
      '--max_restarts=2', '--', *ARGS, f'--workdir={tmp_path}'])
  try:
    target = _mid_epoch_step(epoch=0)
    for attempt in (1, 2):
      pids = launcher.wait_for(
          rf'attempt {attempt}: started workers with pids \[(\d+), (\d+)\]')
      launcher.wait_for(rf'\[worker 1\] .*step {target}/')
      os.kill(int(pids.group(2)), signal.SIGTERM)
      launcher.wait_for(rf'attempt {attempt}: workers exited with \[42, 42\]; '
                        'restarting')
      stops = re.findall(r'Stopped by SIGTERM after step (\d+)',
                         launcher.output)
      target = int(stops[-1]) + random.randrange(2, 8)  # Next attempt's.
    assert launcher.wait() == 0, launcher.output[-3000:]
  finally:
    launcher.kill()
  assert 'attempt 3: training finished' in launcher.output
  assert helpers.fingerprint(launcher.output) == [uninterrupted[2]] * 2


def test_sigterm_to_the_launcher_saves_and_exits_42_without_restarting(
    tmp_path):
  launcher = helpers.Watched([
      *helpers.ctl_command()[:2], 'ctl.launch', '--num_workers=2', '--',
      *ARGS, f'--workdir={tmp_path}'])
  try:
    launcher.wait_for(rf'\[worker 0\] .*step {_mid_epoch_step()}/')
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.wait() == errors.EXIT_PREEMPTED
  finally:
    launcher.kill()
  assert 'stopped on request; workers exited with [42, 42]' in launcher.output
  assert launcher.output.count('started workers') == 1
  stopped = re.search(r'Stopped by SIGTERM after step (\d+)', launcher.output)
  assert helpers.latest_checkpoint_step(tmp_path) == int(stopped.group(1))
