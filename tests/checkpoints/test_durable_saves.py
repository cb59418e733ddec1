"""A "Saved ckpt-N" line is only logged once checkpoint N is durable: a
trainer SIGKILLed the moment the line appears resumes from ckpt-N.

Which save the kill follows comes from a seed the test prints;
CTL_DURABLE_SEED=<seed> reproduces it.
"""

import os
import random
import signal

import pytest

import helpers

# Every 5 steps, on a model wide enough (about 30 MB a checkpoint) that a
# background write takes a while after its save was started.
_EVERY = 5
_OVERRIDES = ('--config.num_epochs=50',
              f'--config.intervals.checkpoint_steps={_EVERY}',
              '--config.intervals.keep_checkpoints=2',
              '--config.model.width=2048')


def _start(workdir) -> helpers.Watched:
  return helpers.Watched(helpers.ctl_command(
      f'--config={helpers.DIGITS}', f'--workdir={workdir}', *_OVERRIDES))


@pytest.mark.slow
def test_a_trainer_killed_at_its_saved_line_resumes_from_that_checkpoint(
    tmp_path):
  # "Saved ckpt-N" was once logged as the background write began: a
  # SIGKILL 80 ms later, and the resume used an older checkpoint.
  seed = int(os.environ.get('CTL_DURABLE_SEED', random.randrange(10**6)))
  print(f'seed {seed} (CTL_DURABLE_SEED={seed} reproduces it)')
  # One kill, at the save the seed picks: each run of the suite tries
  # another of the first four.
  saved = _EVERY * random.Random(seed).randint(1, 4)
  workdir = tmp_path / 'w'
  job = _start(workdir)
  try:
    job.wait_for(rf'Saved \S*ckpt-{saved}\b', timeout=300)
    job.process.send_signal(signal.SIGKILL)
    job.wait()
    assert helpers.latest_checkpoint_step(workdir) == saved, (
        job.output[-3000:])
  finally:
    job.kill()
  resumed = _start(workdir)
  try:
    restored = resumed.wait_for(r'Restored \S*ckpt-(\d+)')
    assert int(restored.group(1)) == saved, resumed.output[-3000:]
  finally:
    resumed.kill()
