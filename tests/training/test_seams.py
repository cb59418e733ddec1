"""The run's parts alone, in this process, as Orbit's controller_test does:
the trainer's phases in their documented order, the loop with a task's
actions and the run's checkpoint, and the checkpoint object itself; and
the call stack of the default run at its first checkpoint save."""

import contextlib
import json
import subprocess
import sys

import numpy as np

import ctl
from ctl import task_hooks
from ctl import config as config_lib
from ctl.cluster import distribution
from ctl.runtime import tf_internals
from ctl.runtime import tf_process
from ctl.runtime import workdir as workdir_lib
from ctl.training import job as job_lib
from ctl.training import trainer as trainer_lib
import helpers


@contextlib.contextmanager
def _trainer(workdir, task_class=None, **fields):
  """A Trainer of the digits task, one epoch (44 steps), made as
  run.train_and_evaluate makes it (its SIGTERM handler and lock held)."""
  config = helpers.digits(1, **fields)
  config_lib.validate(config)
  tf_internals.apply_fixes()
  strategy, role = distribution.build_strategy(config.distribution)
  with tf_process.StopSignal() as stop_signal, workdir_lib.Lock(
      str(workdir)) as lock:
    yield trainer_lib.Trainer(
        config, str(workdir),
        task_class=task_class or task_hooks.resolve(config.task),
        job=job_lib.Job(strategy, role),
        process=job_lib.Process(stop_signal, lock, tf_process.run_start_up()))


class _Steer(ctl.Action):
  """Every 10 steps: records the step; asks for a rollback after step 20
  and a stop after step 30."""

  when = ctl.When(steps=10)
  on_every_worker = True

  def __init__(self):
    self.steps = []

  def run(self, event):
    self.steps.append(event.step)
    if event.step == 20:
      event.request_rollback('a test asked')
    if event.step == 30:
      event.request_stop('a test asked')


def _steered(steer):
  """The digits task class, with `steer` among its actions."""
  base = task_hooks.resolve(helpers.load_config('digits').task)

  class Steered(base):
    def actions(self):
      return [steer]

  return Steered


def test_a_trainer_restores_or_starts_then_trains_then_finishes(tmp_path):
  with _trainer(tmp_path) as trainer:
    assert trainer.restore_or_start() is None
    assert trainer.train() is None
    results = trainer.finish(None)
  assert results['step'] == 44
  assert results['eval']['accuracy'] > 0.5  # The final evaluation ran.
  assert helpers.read_results(tmp_path)['step'] == 44
  assert helpers.latest_checkpoint_step(tmp_path) == 44


def test_the_loop_runs_the_actions_then_the_checkpoint_which_rolls_back(
    tmp_path):
  steer = _Steer()
  with _trainer(tmp_path, _steered(steer),
                **{'intervals.checkpoint_steps': 10}) as trainer:
    assert trainer.restore_or_start() is None
    stopped = trainer.train()
    results = trainer.finish(stopped)
  assert (stopped.step, stopped.reason) == (30, 'a test asked')
  assert results['stopped'] == {'step': 30, 'reason': 'a test asked'}
  assert steer.steps == [10, 20, 30]
  checkpoints = tmp_path / 'checkpoints'
  assert sorted(path.name for path in checkpoints.glob('ckpt-*.index')) == [
      'ckpt-10.index', 'ckpt-20.index', 'ckpt-30.index']
  # The rollback after step 20 put back step 10's weights before the
  # checkpoint of step 20 was saved.
  tensors_10 = helpers.model_tensors(checkpoints / 'ckpt-10')
  tensors_20 = helpers.model_tensors(checkpoints / 'ckpt-20')
  for name, value in tensors_10.items():
    np.testing.assert_array_equal(tensors_20[name], value, err_msg=name)
  assert any(not np.array_equal(value, tensors_10[name]) for name, value in
             helpers.model_tensors(checkpoints / 'ckpt-30').items())


def test_the_checkpoint_object_saves_and_restores_the_whole_state(tmp_path):
  steer = _Steer()
  with _trainer(tmp_path, _steered(steer)) as trainer:
    assert trainer.restore_or_start() is None
    trainer.checkpoint.save(0, stopped='a test stopped it')
    fingerprint = ctl_fingerprint(trainer)
    for variable in trainer.task.model.trainable_variables:
      variable.assign(variable + 1.0)
    assert ctl_fingerprint(trainer) != fingerprint
    assert trainer.checkpoint.restore_weights() == 0
    assert ctl_fingerprint(trainer) == fingerprint
  assert (tmp_path / 'checkpoints' / 'ckpt-0.index').exists()
  with _trainer(tmp_path, _steered(_Steer())) as trainer:
    restored = trainer.checkpoint.restore_latest(
        trainer.length.steps_per_epoch)
    assert (restored.step, restored.stopped) == (0, 'a test stopped it')
    assert ctl_fingerprint(trainer) == fingerprint


def ctl_fingerprint(trainer) -> str:
  """The fingerprint of the task's weights, as results.json has it."""
  from ctl.training import state as state_lib  # pylint: disable=g-import-not-at-top
  return state_lib.weights_fingerprint(trainer.task)


# Run as `python -c`: the default command, with a log handler that keeps
# the ctl modules of the call stack when the first checkpoint is saved
# (Checkpointer.save logs "Saved <path>" once it is written: on the
# training thread when the save is not asynchronous).
_STACK_AT_SAVE = r'''
import inspect, json, logging, os, runpy, sys
import ctl
PACKAGE = os.path.dirname(ctl.__file__)
OUT = sys.argv[1]
class AtSave(logging.Handler):
  stack = None
  def emit(self, record):
    if AtSave.stack is None and record.getMessage().startswith('Saved '):
      AtSave.stack = [
          os.path.relpath(frame.filename, os.path.dirname(PACKAGE))
          for frame in reversed(inspect.stack())
          if frame.filename.startswith(PACKAGE + os.sep)]
      with open(OUT, 'w') as file:
        json.dump(AtSave.stack, file)
logging.getLogger('absl').addHandler(AtSave())
sys.argv = ['ctl.main', *sys.argv[2:]]
runpy.run_module('ctl.main', run_name='__main__', alter_sys=True)
'''


def test_the_default_run_calls_down_only_to_its_first_save(tmp_path):
  stack_file = tmp_path / 'stack.json'
  process = subprocess.run(
      [sys.executable, '-c', _STACK_AT_SAVE, str(stack_file),
       f'--config={helpers.DIGITS}', f'--workdir={tmp_path / "run"}',
       '--config.num_epochs=1', '--config.intervals.async_checkpoint=False'],
      capture_output=True, text=True, timeout=600, check=False,
      env=helpers.env_with())
  assert process.returncode == 0, process.stderr[-3000:]
  frames = json.loads(stack_file.read_text())
  print('The ctl frames at the first save, outermost first:', *frames,
        sep='\n  ')
  entered = [module for index, module in enumerate(frames)
             if index == 0 or frames[index - 1] != module]
  assert frames[0] == 'ctl/main.py'
  assert frames[-1] == 'ctl/checkpoints/manager.py'
  assert len(set(frames)) <= 6, entered
  assert len(entered) == len(set(entered)), f'entered again: {entered}'
