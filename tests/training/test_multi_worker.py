"""Several real worker processes on localhost, each with its own TF_CONFIG."""

import signal
import time

import pytest

from ctl import errors
from ctl.training import run
import helpers

pytestmark = pytest.mark.slow

ARGS = (f'--config={helpers.DIGITS}', '--config.num_epochs=2')


def test_two_workers_train_one_model(tmp_path):
  workdir, scratch = tmp_path / 'workdir', tmp_path / 'tmp'
  scratch.mkdir()
  envs = helpers.cluster_envs(2, TMPDIR=str(scratch))
  for env in envs:  # As in a user's shell: bytecode is written.
    env.pop('PYTHONDONTWRITEBYTECODE', None)
  workers = [helpers.Watched(helpers.ctl_command(*ARGS, f'--workdir={workdir}'),
                             env) for env in envs]
  codes = [worker.wait() for worker in workers]
  assert codes == [0, 0], workers[1].output[-3000:]

  # Both left together (distribution.leave_together), the chief after the
  # results; each through tf_process.exit_now, which skips TensorFlow's
  # shutdown (tests/runtime/test_tf_process.py).
  for worker in workers:
    assert 'Not all workers reached the end together' not in worker.output
  assert 'Results written to' in workers[0].output

  # Identical weights on both workers.
  fingerprints = [print_ for worker in workers
                  for print_ in helpers.fingerprint(worker.output)]
  assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]
  # The chief's files only; the other worker's scratch checkpoints and
  # export are gone.
  assert sorted(path.name for path in workdir.iterdir()) == [
      'best', 'checkpoints', 'config.json', 'eval', 'export', 'results.json',
      'train', 'workers']
  # The chief's events: ctl's reports, and a task's own tf.summary calls.
  assert len(list((workdir / 'train').glob('*.v2'))) == 1
  assert len(list((workdir / 'train').iterdir())) == 2
  assert len(list((workdir / 'eval').iterdir())) == 1
  assert not list(workdir.rglob('workertemp*'))
  assert not list(scratch.iterdir())
  assert 'Took part in saving checkpoint 88' in workers[1].output
  assert 'Took part in the export' in workers[1].output

  # Two workers see the same global batches as one worker, and average
  # gradients over them, so they train (to float rounding) the same model:
  # the one worker in this process (its processes are not what is compared).
  single = tmp_path / 'single'
  run.train_and_evaluate(helpers.digits(num_epochs=2), str(single))
  assert helpers.assert_same_model(workdir / 'checkpoints' / 'ckpt-88',
                                   single / 'checkpoints' / 'ckpt-88',
                                   atol=1e-5) == 6

  # Started again, the finished job says so on both workers and writes nothing.
  before = helpers.file_stamps(workdir)
  codes = helpers.run_workers([*ARGS, f'--workdir={workdir}'],
                              helpers.cluster_envs(2), tmp_path)
  assert codes == [0, 0]
  for index in range(2):
    assert 'Training already finished at step 88' in (
        tmp_path / f'worker{index}.log').read_text()
  assert helpers.file_stamps(workdir) == before


def test_a_batch_that_does_not_divide_across_workers_fails_on_each(tmp_path):
  workdir = tmp_path / 'workdir'
  codes = helpers.run_workers(
      [*ARGS, f'--workdir={workdir}', '--config.batch_size=33'],
      helpers.cluster_envs(2), tmp_path)
  assert codes == [2, 2]
  for index in range(2):
    assert ('config.batch_size=33 does not divide across the 2 replicas'
            in (tmp_path / f'worker{index}.log').read_text())
  assert not workdir.exists()


# Longer than TensorFlow's own heartbeat timeout (10 s), which had failed
# the job (exit 43) whatever distribution.timeout_seconds said, and well
# within this test's timeout.
FROZEN_SECONDS = 15
FROZEN_TIMEOUT_SECONDS = 40


def _freeze(workers: list[helpers.Watched], indices) -> None:
  """Stops those workers (SIGSTOP) for FROZEN_SECONDS while the job runs."""
  for index in indices:
    workers[index].process.send_signal(signal.SIGSTOP)
  # Each froze mid-job, not after it finished.
  assert all(worker.process.poll() is None for worker in workers)
  time.sleep(FROZEN_SECONDS)  # The length of the fault itself.
  for index in indices:
    workers[index].process.send_signal(signal.SIGCONT)


def test_workers_frozen_for_less_than_the_timeout_cost_time_not_the_job(
    tmp_path):
  # A garbage-collection pause, a slow write, a Slurm suspend of the whole
  # job: a worker, then all (the chief with TensorFlow's coordination
  # service among them), stopped for less than
  # distribution.timeout_seconds, in one job.
  args = (*ARGS, f'--workdir={tmp_path}', '--config.num_epochs=8',
          '--config.batch_size=48', '--config.steps_per_loop=4',
          '--config.intervals.log_steps=4',
          f'--config.distribution.timeout_seconds={FROZEN_TIMEOUT_SECONDS}')
  workers = [helpers.Watched(helpers.ctl_command(*args), env)
             for env in helpers.cluster_envs(3)]
  try:
    workers[1].wait_for(r' step 8/', 300)
    _freeze(workers, [1])
    workers[1].wait_for(r' step 24/', 300)  # The job went on.
    _freeze(workers, [0, 1, 2])
    codes = [worker.wait(timeout=600) for worker in workers]
  finally:
    for worker in workers:
      worker.process.send_signal(signal.SIGCONT)
      worker.kill()
  assert codes == [0, 0, 0], '\n'.join(
      worker.output[-2000:] for worker in workers)
  assert 'Results written to' in workers[0].output


def test_a_worker_frozen_past_the_timeout_is_named_by_the_watchdog(tmp_path):
  # Past distribution.timeout_seconds the job fails (exit 43) within the
  # timeout, and the message names what noticed it with its real timeout:
  # the watchdog, at the timeout the user set (TensorFlow's heartbeat had
  # fired first, after its own 10 s, and the message named the user's
  # timeout). 20 s: a loaded machine's first steps take more than 15.
  timeout = 20
  args = (*ARGS, f'--workdir={tmp_path}', '--config.num_epochs=200',
          '--config.steps_per_loop=4', '--config.intervals.log_steps=4',
          f'--config.distribution.timeout_seconds={timeout}')
  workers = [helpers.Watched(helpers.ctl_command(*args), env)
             for env in helpers.cluster_envs(2)]
  try:
    workers[0].wait_for(r' step 8/', 300)
    hung_at = time.monotonic()
    workers[1].process.send_signal(signal.SIGSTOP)
    code = workers[0].wait(timeout=300)
    assert time.monotonic() - hung_at < timeout + 20
  finally:
    for worker in workers:
      worker.kill()
  assert code == errors.EXIT_PEER_FAILED, workers[0].output[-3000:]
  [line] = [line for line in workers[0].output.splitlines()
            if line.startswith('ctl: error:')]
  assert line.startswith(
      'ctl: error: Lost the other workers (DeadlineExceededError): this '
      f'worker made no progress for distribution.timeout_seconds={timeout} '
      '(its watchdog ended the wait)'), line
