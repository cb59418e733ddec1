"""A user's own task over a tf.data pipeline, stopped by SIGTERM mid-epoch
and resumed: bit-identical to an uninterrupted run, on 2 replicas in one
process (one pipeline feeding both)."""

import re
import signal
import sys

import pytest

from ctl import errors
import helpers

pytestmark = pytest.mark.slow

CONFIG = str(helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py')
ARGS = (f'--config={CONFIG}', '--config.deterministic=True')
TOTAL_STEPS = 48  # 3 epochs of 16 steps.


def _two_replicas(workdir):
  return [helpers.Watched([
      sys.executable, str(helpers.REPO / 'tests' / 'split_cpu.py'), '2',
      *ARGS, '--config.distribution.strategy=mirrored',
      f'--workdir={workdir}'])]


# On 2 workers, the resume conformance matrix stops this task (SIGKILL) and
# another task's pipeline (SIGTERM): tests/training/test_resume_conformance.py.
@pytest.mark.parametrize('start', [_two_replicas], ids=['two_replicas'])
def test_sigterm_mid_epoch_then_resume_is_bit_identical(tmp_path, start):
  reference = start(tmp_path / 'reference')
  assert [job.wait() for job in reference] == [0] * len(reference), (
      reference[-1].output[-3000:])
  expected = helpers.fingerprint(reference[0].output)

  for attempt in range(3):
    workdir = tmp_path / f'attempt{attempt}'
    jobs = start(workdir)
    jobs[-1].wait_for(r'step 20/48 ')  # Epoch 2, step 4 of 16.
    jobs[-1].process.send_signal(signal.SIGTERM)
    codes = [job.wait() for job in jobs]
    if codes == [errors.EXIT_PREEMPTED] * len(jobs):
      break
    # On a loaded machine the job may finish before the signal takes effect.
    assert codes == [0] * len(jobs), jobs[-1].output[-3000:]
  else:
    pytest.fail('The job finished before SIGTERM in all 3 attempts')
  step = int(re.search(r'Stopped by SIGTERM after step (\d+)',
                       jobs[0].output).group(1))
  assert 20 <= step < TOTAL_STEPS
  # Every worker saved its own data position at that step.
  positions = sorted(path.parent.name for path in
                     workdir.glob(f'checkpoints/data/*/ckpt-{step}.index'))
  assert len(positions) == len(jobs)

  resumed = start(workdir)
  assert [job.wait() for job in resumed] == [0] * len(resumed)
  for job in resumed:
    assert f'Training from step {step} to {TOTAL_STEPS}' in job.output
    assert helpers.fingerprint(job.output) == expected
