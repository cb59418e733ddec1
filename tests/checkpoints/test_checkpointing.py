"""Checkpoints against a tiny model: restore with checks, refusal that
changes nothing, a moved-away latest, warm start, each worker's data
position."""

import types
import keras
import numpy as np
import pytest
import tensorflow as tf

from ctl import errors
from ctl.checkpoints import contents as checkpoint_contents
from ctl.checkpoints import data_positions
from ctl.checkpoints import manager as checkpoint_manager
import helpers


def _model(width=2):
  return keras.Sequential([keras.Input((3,)), keras.layers.Dense(width)])


def _checkpointer(directory, model, **kwargs):
  return checkpoint_manager.Checkpointer(
      tf.train.Checkpoint(model=model), str(directory), is_chief=True,
      task_id=0, max_to_keep=3, **kwargs)


def test_restores_the_latest_and_skips_saving_it_again(tmp_path):
  model = _model()
  saver = _checkpointer(tmp_path, model)
  saver.save(1)
  model.weights[0].assign(tf.ones_like(model.weights[0]))
  saver.save(2)
  fresh = _model()
  restorer = _checkpointer(tmp_path, fresh)
  assert restorer.restore_latest().endswith('ckpt-2')
  np.testing.assert_array_equal(fresh.weights[0].numpy(), 1.0)
  before = helpers.file_stamps(tmp_path)
  restorer.save(2)  # Just restored: not written again.
  assert helpers.file_stamps(tmp_path) == before


def test_a_checkpoint_of_another_model_is_refused_untouched(tmp_path):
  _checkpointer(tmp_path, _model(width=2)).save(1)
  before = helpers.file_stamps(tmp_path)
  with pytest.raises(errors.CtlError, match='does not match') as error:
    _checkpointer(tmp_path, _model(width=5)).restore_latest()
  assert 'left untouched' in str(error.value)
  assert helpers.file_stamps(tmp_path) == before


def test_a_latest_checkpoint_moved_away_falls_back_to_the_previous(tmp_path):
  model = _model()
  saver = _checkpointer(tmp_path, model)
  saver.save(1)
  saver.save(2)
  for path in tmp_path.glob('ckpt-2.*'):
    path.unlink()
  assert _checkpointer(tmp_path, _model()).restore_latest().endswith('ckpt-1')


def test_warm_start_reads_models_by_attribute_name(tmp_path):
  source = tf.Module()
  source.model = _model()
  source.model.weights[0].assign(tf.fill([3, 2], 7.0))
  tf.train.Checkpoint(task=source).write(str(tmp_path / 'ckpt-5'))
  target = types.SimpleNamespace(model=_model())
  checkpoint_contents.warm_start(target, str(tmp_path / 'ckpt-5'))
  np.testing.assert_array_equal(target.model.weights[0].numpy(), 7.0)
  with pytest.raises(errors.CtlError, match='Cannot warm-start'):
    checkpoint_contents.warm_start(
        types.SimpleNamespace(model=_model(width=4)), str(tmp_path / 'ckpt-5'))


def test_data_positions_resume_the_next_batches(tmp_path):
  dataset = tf.data.Dataset.range(100).shuffle(50, seed=1).batch(4)
  iterator = iter(dataset)
  positions = data_positions.DataPositions(
      {'iterator': iterator}, str(tmp_path), pipeline=1, num_pipelines=2,
      max_to_keep=2)
  positions.check_savable(dataset)
  for step in range(1, 4):
    next(iterator)
    positions.save(step)
  expected = [next(iterator).numpy() for _ in range(3)]
  # Two kept, in the pipeline's own directory.
  assert sorted(path.name for path in (tmp_path / 'pipeline-1-of-2').glob(
      '*.index')) == ['ckpt-2.index', 'ckpt-3.index']
  resumed = iter(dataset)
  data_positions.DataPositions(
      {'iterator': resumed}, str(tmp_path), pipeline=1, num_pipelines=2,
      max_to_keep=2).restore(3)
  for batch in expected:
    np.testing.assert_array_equal(next(resumed).numpy(), batch)
  with pytest.raises(errors.CtlError, match='data position of step 1 is '
                     'missing'):
    positions.restore(1)


def _noise(x):
  return tf.cast(x, tf.float32) + tf.random.uniform([])


@pytest.mark.parametrize('dataset', [
    tf.data.Dataset.range(10).map(_noise),
    # Before a shuffle, an iterator that has not started saves fine: the op
    # is met only once the shuffle fills its buffer.
    tf.data.Dataset.range(10).map(_noise).shuffle(5, seed=1).batch(2),
    tf.data.Dataset.range(10).shuffle(5, seed=1).map(_noise).prefetch(1),
    tf.data.Dataset.range(4).interleave(
        lambda i: tf.data.Dataset.range(i).map(_noise), cycle_length=2,
        num_parallel_calls=2),
], ids=['alone', 'before_shuffle', 'after_shuffle', 'inside_interleave'])
def test_a_pipeline_with_a_stateful_op_is_refused_naming_it(tmp_path,
                                                            dataset):
  positions = data_positions.DataPositions(
      {'iterator': iter(dataset)}, str(tmp_path), max_to_keep=1)
  with pytest.raises(errors.CtlError, match='RandomUniform is stateful'):
    positions.check_savable(dataset)
  assert not list(tmp_path.iterdir())


def test_a_position_that_cannot_be_saved_later_is_a_clear_error(tmp_path):
  dataset = tf.data.Dataset.range(10).map(_noise).shuffle(5, seed=1)
  iterator = iter(dataset)
  positions = data_positions.DataPositions(
      {'iterator': iterator}, str(tmp_path), max_to_keep=1)
  next(iterator)
  with pytest.raises(errors.CtlError, match='RandomUniform is stateful'):
    positions.save(1)


def _positions(tmp_path, pipeline, num_pipelines):
  return data_positions.DataPositions(
      {'iterator': iter(tf.data.Dataset.range(10))}, str(tmp_path / 'data'),
      pipeline=pipeline, num_pipelines=num_pipelines, max_to_keep=3)


def test_positions_saved_by_another_number_of_workers_are_refused(tmp_path):
  for pipeline in range(2):
    _positions(tmp_path, pipeline, 2).save(4)
  assert _positions(tmp_path, 0, 2).problem(4) is None
  for num_pipelines in (1, 3):
    with pytest.raises(errors.ConfigError, match='saved by 2 worker.s., and '
                       f'this job has {num_pipelines}.*Resume with 2'):
      _positions(tmp_path, 0, num_pipelines).problem(4)


def test_a_checkpoint_without_every_workers_data_position_is_not_latest(
    tmp_path):
  saver = _checkpointer(tmp_path, _model(),
                        data=_positions(tmp_path, 0, 2))
  for pipeline in range(2):
    _positions(tmp_path, pipeline, 2).save(1)
  saver.save(1)
  # Pipeline 1's worker was killed before it wrote its position of step 2.
  _positions(tmp_path, 0, 2).save(2)
  saver.save(2)
  restorer = _checkpointer(tmp_path, _model(),
                           data=_positions(tmp_path, 1, 2))
  assert restorer.restore_latest().endswith('ckpt-1')
  # On one worker, the whole step 1 of two workers is a changed shape.
  with pytest.raises(errors.ConfigError, match='saved by 2 worker'):
    _checkpointer(tmp_path, _model(),
                  data=_positions(tmp_path, 0, 1)).latest


def test_checkpoints_that_cannot_resume_stop_the_run_untouched(tmp_path):
  saver = _checkpointer(tmp_path, _model())
  saver.save(1)
  saver.save(2)
  before = helpers.file_stamps(tmp_path)
  # A task that reads a tf.data pipeline finds no data position at all.
  restorer = _checkpointer(tmp_path, _model(),
                           data=_positions(tmp_path, 0, 1))
  with pytest.raises(errors.CtlError, match=r'(?s)No checkpoint .* can '
                     r'resume.*ckpt-2 has no data position.*ckpt-1 has no '
                     'data position'):
    restorer.restore_latest()
  assert helpers.file_stamps(tmp_path) == before
