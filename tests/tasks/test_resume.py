"""Every shipped task, stopped by SIGTERM mid-epoch and run again, ends
bit-identical to an uninterrupted run (deterministic mode).

The built-in classification task, the TFRecord task and the text example
have tests of their own (tests/training/test_preemption.py,
tests/data/test_tfrecord.py, tests/tasks/test_examples.py).
"""

import re
import signal

import pytest

from ctl import errors
import helpers

pytestmark = pytest.mark.slow

TOTAL_STEPS = 40
# The same command each time: 25 steps an epoch, stopped in the second.
COMMON = ('--config.deterministic=True', '--config.intervals.log_steps=1',
          f'--config.total_steps={TOTAL_STEPS}', '--config.steps_per_epoch=25')
TASKS = {
    'regression': ('--config=configs/regression.py:smoke',),
    'clip_ema': ('--config=configs/clip_ema.py:smoke',),
    'gan': ('--config=configs/gan.py:smoke',),
    'keras_model': (f'--config={helpers.DIGITS}', '--config.task=keras_model',
                    '--config.data.name=user_modules:blobs',
                    '--config.model.name=user_modules:counting_model',
                    '--config.evaluation.best_metric=acc'),
}


def _start(args, workdir):
  env = helpers.env_with()
  env['PYTHONPATH'] += f':{helpers.REPO}'  # experiments/ importable.
  return helpers.Watched(
      helpers.ctl_command(*args, *COMMON, f'--workdir={workdir}'), env)


@pytest.mark.parametrize('name', sorted(TASKS))
def test_sigterm_mid_epoch_then_resume_is_bit_identical(tmp_path, name):
  args = TASKS[name]
  reference = _start(args, tmp_path / 'reference')
  assert reference.wait() == 0, reference.output[-3000:]

  for attempt in range(3):
    workdir = tmp_path / f'stopped{attempt}'
    stopped = _start(args, workdir)
    stopped.wait_for(rf'step 30/{TOTAL_STEPS} ')
    stopped.process.send_signal(signal.SIGTERM)
    code = stopped.wait()
    if code == errors.EXIT_PREEMPTED:
      break
    # On a loaded machine the run may finish before the signal takes effect.
    assert code == 0, stopped.output[-3000:]
  else:
    pytest.fail('The run finished before SIGTERM in all 3 attempts')
  step = int(re.search(r'Stopped by SIGTERM after step (\d+)',
                       stopped.output).group(1))
  assert 30 <= step < TOTAL_STEPS

  resumed = _start(args, workdir)
  assert resumed.wait() == 0, resumed.output[-3000:]
  assert f'Training from step {step} to {TOTAL_STEPS}' in resumed.output
  assert helpers.fingerprint(resumed.output) == helpers.fingerprint(
      reference.output)
