"""Gradient accumulation (config.accumulate_steps, ctx.accumulate): a step
of micro-batches equals the step on the whole batch, on 1 replica, 2
replicas and 2 workers, with one optimizer step per update."""

import sys

import pytest

from ctl import errors
from ctl.training import run
from ctl.training import state as state_lib
import helpers

STEPS = 20
# An MLP with no batch-dependent layer (no dropout); its L2 term is counted
# once per update however many micro-batches make it.
ARGS = (f'--config={helpers.DIGITS}', '--config.model.name=mlp',
        '--config.model.dropout=0', '--config.model.l2=0.001',
        f'--config.total_steps={STEPS}', '--config.deterministic=True',
        '--config.intervals.eval_steps=0')


def _train_here(workdir, **fields) -> None:
  """ARGS' run on one replica in this process (no signal or process is
  under test there: a TensorFlow start saved)."""
  run.train_and_evaluate(helpers.digits(20, **{  # configs/digits.py's 20.
      'model.name': 'mlp', 'model.dropout': 0.0, 'model.l2': 0.001,
      'total_steps': STEPS, 'deterministic': True,
      'intervals.eval_steps': 0, **fields}), str(workdir))


def _iterations(workdir) -> int:
  tensors = helpers.checkpoint_tensors(workdir / 'checkpoints' / f'ckpt-{STEPS}')
  [iterations] = [value for name, value in tensors.items()
                  if name.startswith('task/optimizer/_iterations/')]
  return int(iterations)


@pytest.mark.slow
def test_micro_batches_equal_the_whole_batch_on_replicas_and_workers(
    tmp_path):
  _train_here(tmp_path / 'whole')
  _train_here(tmp_path / 'one', accumulate_steps=4)
  accumulated = ('--config.accumulate_steps=4',)
  replicas = helpers.Watched([
      sys.executable, str(helpers.REPO / 'tests' / 'split_cpu.py'), '2',
      *ARGS, *accumulated, '--config.distribution.strategy=mirrored',
      f'--workdir={tmp_path / "replicas"}'])
  assert replicas.wait() == 0, replicas.output[-3000:]
  codes = helpers.run_workers(
      [*ARGS, *accumulated, f'--workdir={tmp_path / "workers"}'],
      helpers.cluster_envs(2), tmp_path)
  assert codes == [0, 0], (tmp_path / 'worker0.log').read_text()[-3000:]

  reference = tmp_path / 'whole' / 'checkpoints' / f'ckpt-{STEPS}'
  for name in ('one', 'replicas', 'workers'):
    checkpoint = tmp_path / name / 'checkpoints' / f'ckpt-{STEPS}'
    assert helpers.assert_same_model(checkpoint, reference, atol=2e-5) == 4
    # One optimizer step per update, not per micro-batch.
    assert _iterations(tmp_path / name) == STEPS
  assert helpers.read_results(tmp_path / 'one')['eval']['loss'] == (
      pytest.approx(helpers.read_results(tmp_path / 'whole')['eval']['loss'],
                    rel=1e-5))


def test_a_batch_that_does_not_split_into_micro_batches_is_a_config_error():
  config = helpers.digits(accumulate_steps=3)  # batch_size 32.
  with pytest.raises(errors.ConfigError,
                     match=r'config.batch_size=32 does not divide across the 2 '
                     r'replica\(s\) x config.accumulate_steps=3 micro-batches: '
                     r'use a multiple of 6'):
    state_lib.check_batch_sizes(config, num_replicas=2)
  state_lib.check_batch_sizes(helpers.digits(accumulate_steps=4), 2)
  # No number of replicas fits 50 into 4 micro-batches: the message names
  # the accumulate_steps that do, not an empty list of replicas.
  with pytest.raises(errors.ConfigError) as raised:
    state_lib.check_batch_sizes(
        helpers.digits(batch_size=50, accumulate_steps=4), num_replicas=1)
  assert str(raised.value).endswith(
      'use a multiple of 4, or config.accumulate_steps in 1, 2, 5, 10, 25, '
      '50.'), raised.value


def test_a_step_that_does_not_accumulate_is_an_error_not_a_silent_whole_batch(
    tmp_path):
  config = helpers.digits(
      1, task='keras_model', accumulate_steps=2,
      **{'data.name': 'user_modules:blobs',
         'model.name': 'user_modules:counting_model',
         'evaluation.best_metric': 'acc'})
  with pytest.raises(errors.ConfigError,
                     match=r'config.accumulate_steps=2, but the task\'s '
                     r'train_step does not call ctx.accumulate'):
    run.train_and_evaluate(config, str(tmp_path))
  # A config mistake, refused before anything is written.
  assert not tmp_path.exists() or not list(tmp_path.iterdir())


@pytest.mark.slow
def test_keras_own_accumulation_on_two_replicas_is_refused_with_the_way_out(
    tmp_path):
  run = helpers.Watched([
      sys.executable, str(helpers.REPO / 'tests' / 'split_cpu.py'), '2',
      f'--config={helpers.DIGITS}', '--config.task=keras_model',
      '--config.data.name=user_modules:blobs',
      '--config.model.name=user_modules:keras_accumulating_model',
      '--config.distribution.strategy=mirrored', f'--workdir={tmp_path}'])
  assert run.wait() == errors.EXIT_FAILURE, run.output[-3000:]
  assert run.output.count('ctl: error: ') == 1
  assert 'gradient_accumulation_steps=2' in run.output
  assert 'config.accumulate_steps' in run.output
  assert not (tmp_path / 'checkpoints').exists()
