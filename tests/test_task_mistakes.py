"""A user's mistake in a task is one `ctl: error:` line saying what to do:
a hook that raises ends the run with its traceback, then a line naming the
hook, its class (the task's or its action's) and the exception
(ctl/training/failures.py, `task_failure`); a pipeline whose position
cannot be saved is refused with every reason at once
(ctl/checkpoints/data_positions.py)."""

import re

import pytest

import helpers

NOISY = 'tests/configs/noisy_regression.py'


@pytest.mark.parametrize('hook, task, raiser', [
    ('train_step', 'BugInTrainStep', 'BugInTrainStep'),
    ('eval_step', 'BugInEvalStep', 'BugInEvalStep'),
    ('eval_end', 'BugInEvalEnd', 'BugInEvalEnd'),
    ('serving_signature', 'BugInServingSignature', 'BugInServingSignature'),
    ('run', 'BugInAnAction', 'RaisingAction')])
def test_a_hook_that_raises_is_one_line_naming_it_after_its_traceback(
    tmp_path, hook, task, raiser):
  run = helpers.run_ctl(f'--config={NOISY}',
                        f'--config.task=faulty_tasks:{task}',
                        '--config.total_steps=2', f'--workdir={tmp_path}')
  assert run.returncode == 1, run.stderr[-3000:]
  lines = [line for line in run.stderr.splitlines()
           if line.startswith('ctl: ')]
  assert lines == [
      f'ctl: error: faulty_tasks.{raiser}.{hook}() raised RuntimeError: a bug '
      f'in {hook} (the traceback is above). Fix the task and run the same '
      'command again (the checkpoints saved before are kept).'
  ], run.stderr[-3000:]
  assert run.stderr.rstrip().endswith(lines[0])
  # The user's hook in the traceback above the message (a step as
  # AutoGraph converted it).
  traceback = run.stderr[run.stderr.index('Traceback'):]
  assert re.search(rf'line \d+, in (tf__)?{hook}\n', traceback), traceback
  assert f'RuntimeError: a bug in {hook}\n' in traceback
  assert not (tmp_path / 'export').exists()
  if hook == 'train_step':
    assert not (tmp_path / 'checkpoints').exists()


def test_every_problem_of_a_pipeline_is_refused_at_once(tmp_path):
  run = helpers.run_ctl(f'--config={NOISY}',
                        '--config.task=faulty_tasks:ThreeProblems',
                        f'--workdir={tmp_path}')
  assert run.returncode == 1, run.stderr[-3000:]
  [line] = [line for line in run.stderr.splitlines()
            if line.startswith('ctl: ')]
  assert line.startswith('ctl: error: The training pipeline has 3 problems. '
                         '(1) '), line
  for reason in ('RandomUniform is stateful', 'EagerPyFunc is stateful',
                 '(ShuffleDatasetV3) below another shuffle'):
    assert reason in line, line
  assert line.endswith('Nothing was written.'), line
  assert 'Training from step' not in run.stderr
  assert not (tmp_path / 'checkpoints').exists()
