"""A user's own task: its steps, data, logs, summaries and eval results run
under ctl's loop with every guarantee; its mistakes get one clear message."""

import pytest
import tensorflow as tf

from ctl import errors
from ctl import task_hooks
from ctl.training import run
import helpers
import user_modules


def _noisy(task='NoisyRegression', **fields):
  config = helpers.load_config_file(
      helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py', task)
  return helpers.override(config, deterministic=True, **fields)


@pytest.mark.slow
def test_a_tf_data_task_resumes_mid_epoch_bit_identical(tmp_path):
  uninterrupted = run.train_and_evaluate(_noisy(), str(tmp_path / 'whole'))
  assert uninterrupted['step'] == 48
  assert uninterrupted['eval']['mae'] < 0.3
  # Stopped at step 22 of 48: mid-epoch (16 steps each), shuffle buffer,
  # stateless augmentation and dropout state all in flight.
  run.train_and_evaluate(_noisy(total_steps=22), str(tmp_path / 'resumed'))
  assert (tmp_path / 'resumed/checkpoints/data/pipeline-0-of-1/ckpt-22.index').exists()
  resumed = run.train_and_evaluate(_noisy(), str(tmp_path / 'resumed'))
  assert resumed['weights_sha256'] == uninterrupted['weights_sha256']


def test_summaries_of_the_step_and_every_eval_result_reach_tensorboard(
    tmp_path):
  results = run.train_and_evaluate(
      _noisy('SummarizedRegression', **{'intervals.summary_steps': 4}),
      str(tmp_path))
  assert set(results['eval']) == {'near', 'far'}
  assert results['eval']['near']['examples'] == 100
  assert results['eval']['far']['examples'] == 60
  written = helpers.read_events(tmp_path / 'train')
  assert [step for step, _ in written['kernel_norm']] == list(range(4, 49, 4))
  for name in ('near', 'far'):
    events = helpers.read_events(tmp_path / 'eval' / name)
    assert [step for step, _ in events['mse']] == [16, 32, 48]
    assert {'errors', 'error_image', 'mae'} <= set(events)
  # Images and histograms are for TensorBoard, not results.json.
  assert set(helpers.read_results(tmp_path)['eval']['near']) == {
      'mse', 'mae', 'examples'}


def test_a_keras_models_own_train_step_runs_under_ctl(tmp_path):
  config = helpers.digits(3, task='keras_model', steps_per_epoch=10, **{
      'data.name': 'user_modules:blobs', 'model.name':
      'user_modules:counting_model',
      # The model's compiled metric is named 'acc'.
      'evaluation.best_metric': 'acc'})
  results = run.train_and_evaluate(config, str(tmp_path))
  assert results['step'] == 30
  assert results['eval']['acc'] > 0.9
  tensors = helpers.checkpoint_tensors(tmp_path / 'checkpoints' / 'ckpt-30')
  [calls] = [value for name, value in tensors.items() if 'train_calls' in name]
  assert calls == 30  # Its own train_step ran every step.


@pytest.mark.parametrize('task, message', [
    ('user_modules:MissingStep', 'lacks train_step'),
    ('user_modules:no_such_task', "has no function 'no_such_task'"),
    ('no_such_module:Task', "Cannot import module 'no_such_module'"),
    ('user_modules:blobs', 'is not a subclass of ctl.Task'),
])
def test_a_task_that_cannot_run_is_a_config_error(task, message):
  with pytest.raises(errors.ConfigError, match=message):
    task_hooks.resolve(task)


@pytest.mark.parametrize('task, message', [
    ('StatefulPipeline', 'RandomUniform is stateful'),
    ('StatefulBeforeShuffle', 'RandomUniform is stateful'),
    ('ShadowsModels', 'sets attribute.s. models, which hide'),
    ('NonScalarLogs', "log 'per_example' of shape"),
])
def test_a_task_mistake_fails_before_anything_is_written(tmp_path, task,
                                                         message):
  with pytest.raises(errors.CtlError, match=message):
    run.train_and_evaluate(_noisy(task), str(tmp_path / 'workdir'))
  assert not list(tmp_path.glob('workdir/checkpoints/*'))


def test_a_step_that_cannot_take_the_batch_names_its_structure(tmp_path):
  config = helpers.digits(1, **{'data.name': 'user_modules:blobs',
                                'model.name': 'user_modules:linear',
                                'loss': 'user_modules:three_arguments'})
  with pytest.raises(errors.CtlError, match=r"train_step failed on a batch "
                     r"of structure \('float32\[32, 4\]', 'int32\[32\]'\)"):
    run.train_and_evaluate(config, str(tmp_path))


def test_a_checkpoint_of_another_task_is_refused_and_kept(tmp_path):
  run.train_and_evaluate(_noisy(total_steps=4), str(tmp_path))
  before = helpers.file_stamps(tmp_path)
  with pytest.raises(errors.CtlError, match='does not match'):
    run.train_and_evaluate(helpers.digits(1), str(tmp_path))
  assert helpers.file_stamps(tmp_path) == before


def test_a_model_reached_twice_is_one_model_that_serves():
  # tf.Module tracks every attribute again in attributes of its own, and a
  # list may hold the same model: one model all the same.
  task = user_modules.NoisyRegression(_noisy())
  task.build()
  task.also = [task.model]
  assert task.models() == [task.model]
  serve = task.serving_signature()
  assert serve(tf.zeros([3, 4])).shape == (3, 1)
