"""Preemption with real processes and real signals: nothing lost, bit-identical.

Every run here uses one config in deterministic mode, with dropout (so the
random layers' state must be checkpointed too), a log line and a checkpoint
after every step (so a kill often lands while a checkpoint is written), and
is compared with an uninterrupted run of the same config. Kill points are
drawn from a seed each test prints; CTL_PREEMPTION_SEED=<seed> reproduces
them.
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

SEED = int(os.environ.get('CTL_PREEMPTION_SEED', random.randrange(10**6)))
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


@pytest.fixture
def rng(request) -> random.Random:
  """The test's random choices, from SEED (printed) and the test's name."""
  print(f'seed {SEED} (CTL_PREEMPTION_SEED={SEED} reproduces it)')
  return random.Random(f'{SEED}-{request.node.name}')


def _mid_epoch_step(rng: random.Random, epoch: int | None = None) -> int:
  """A random step in the first half of epoch 0 or 1."""
  epoch = rng.randrange(2) if epoch is None else epoch
  return STEPS_PER_EPOCH * epoch + rng.randrange(3, STEPS_PER_EPOCH // 2)


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


def test_sigterm_saves_the_step_reached_and_a_later_sigkill_loses_nothing(
    tmp_path, uninterrupted, rng):
  # One worker: SIGTERM mid-epoch saves the step reached; the resumed run
  # is killed (SIGKILL) at a random moment, often while it saves (every
  # other step); the next run resumes from the newest complete checkpoint
  # and ends bit-identical to the uninterrupted run.
  target = _mid_epoch_step(rng)
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
  resumed.wait_for(rf'step {stopped + rng.randrange(2, 15)}/{TOTAL_STEPS} ')
  time.sleep(rng.uniform(0.0, 0.05))
  resumed.process.send_signal(signal.SIGKILL)
  assert resumed.wait() == -signal.SIGKILL
  assert _resumed_from(resumed.output) == stopped
  # The first step trained after the resume is the one after the stop.
  first_step = re.search(rf'step (\d+)/{TOTAL_STEPS} ',
                         resumed.output).group(1)
  assert int(first_step) == stopped + 1
  # The newest complete checkpoint is the one the next run resumes from.
  resume_at = helpers.latest_checkpoint_step(workdir)

  [final] = _start(workdir)
  assert final.wait() == 0, final.output[-3000:]
  assert _resumed_from(final.output) == resume_at
  assert helpers.fingerprint(final.output) == [uninterrupted[1]]


def _attempt_lines(output: str, attempt: int, worker: int) -> str:
  """A worker's lines of one attempt of ctl.launch, without the prefix."""
  prefix = f'[worker {worker}] '
  segment = re.split(r'attempt \d+: started workers', output)[attempt]
  return ''.join(line[len(prefix):] + '\n' for line in segment.splitlines()
                 if line.startswith(prefix))


def _last_step(output: str) -> int:
  """The highest step any worker has logged so far."""
  return max(map(int, re.findall(rf'step (\d+)/{TOTAL_STEPS} ', output)),
             default=0)


def test_a_job_sigtermed_then_sigkilled_twice_resumes_to_the_same_weights(
    tmp_path, uninterrupted, rng):
  # One 2-worker job under ctl.launch, stopped three ways before it
  # finishes: SIGTERM to worker 1 (both stop at one step and save), then
  # SIGKILL of worker 0 (the chief, host of TensorFlow's coordination
  # service), then of worker 1 (the other fails fast, 43). Each restart
  # resumes from the newest complete checkpoint; the last ends with the
  # uninterrupted run's weights.
  launcher = helpers.Watched([
      *helpers.ctl_command()[:2], 'ctl.launch', '--num_workers=2',
      '--max_restarts=3', '--', *ARGS, f'--workdir={tmp_path}'])
  resumes = {}  # {attempt: the newest checkpoint when it started}
  try:
    pids = launcher.wait_for(
        r'attempt 1: started workers with pids \[(\d+), (\d+)\]')
    launcher.wait_for(rf'\[worker 1\] .*step {_mid_epoch_step(rng, 0)}/')
    os.kill(int(pids.group(2)), signal.SIGTERM)
    launcher.wait_for(r'attempt 1: workers exited with \[42, 42\]; '
                      r'restarting \(1 of 3\)')
    # Read before the restarted workers, seconds from a step, could save.
    resumes[2] = helpers.latest_checkpoint_step(tmp_path)
    for attempt, victim in ((2, 0), (3, 1)):
      pids = launcher.wait_for(rf'attempt {attempt}: started workers with '
                               r'pids \[(\d+), (\d+)\]')
      # Past every step logged so far, of this attempt or an earlier one.
      target = _last_step(launcher.output) + rng.randrange(2, 8)
      launcher.wait_for(rf'\[worker {victim}\] .*step {target}/')
      killed_at = time.monotonic()
      os.kill(int(pids.group(victim + 1)), signal.SIGKILL)
      codes = [-signal.SIGKILL, errors.EXIT_PEER_FAILED]
      launcher.wait_for(re.escape(
          f'attempt {attempt}: workers exited with '
          f'{codes if victim == 0 else codes[::-1]}; restarting '
          f'({attempt} of 3)'))
      assert time.monotonic() - killed_at < TIMEOUT_SECONDS + 20
      resumes[attempt + 1] = helpers.latest_checkpoint_step(tmp_path)
      survivor = _attempt_lines(launcher.output, attempt, 1 - victim)
      assert 'restart every worker' in survivor, survivor[-3000:]
    assert launcher.wait() == 0, launcher.output[-3000:]
  finally:
    launcher.kill()
  assert 'attempt 4: training finished' in launcher.output

  # SIGTERM to one worker stopped both after the same step, saved there.
  stops = re.findall(r'Stopped by SIGTERM after step (\d+)',
                     re.split('attempt 2: started', launcher.output)[0])
  assert len(stops) == 2 and len(set(stops)) == 1, stops
  assert resumes[2] == int(stops[0])
  assert 'Took part in saving checkpoint' in _attempt_lines(
      launcher.output, 1, 1)
  for attempt, resume_at in resumes.items():
    for worker in (0, 1):
      assert _resumed_from(_attempt_lines(launcher.output, attempt,
                                          worker)) == resume_at
  assert helpers.fingerprint(launcher.output) == [uninterrupted[2]] * 2


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


def test_sigterm_to_the_launcher_saves_and_exits_42_without_restarting(
    tmp_path, rng):
  launcher = helpers.Watched([
      *helpers.ctl_command()[:2], 'ctl.launch', '--num_workers=2', '--',
      *ARGS, f'--workdir={tmp_path}'])
  try:
    launcher.wait_for(rf'\[worker 0\] .*step {_mid_epoch_step(rng)}/')
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.wait() == errors.EXIT_PREEMPTED
  finally:
    launcher.kill()
  assert 'stopped on request; workers exited with [42, 42]' in launcher.output
  assert launcher.output.count('started workers') == 1
  stopped = re.search(r'Stopped by SIGTERM after step (\d+)', launcher.output)
  assert helpers.latest_checkpoint_step(tmp_path) == int(stopped.group(1))
