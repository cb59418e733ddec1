"""Checkpoints against a tiny model: restore with checks, refusal that
changes nothing, a moved-away latest, warm start, each worker's data
position."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from ctl import errors
from ctl.runtime import checkpointing
import helpers


def _model(width=2):
  return keras.Sequential([keras.Input((3,)), keras.layers.Dense(width)])


def _checkpointer(directory, model, **kwargs):
  return checkpointing.Checkpointer(
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
  target = _model()
  checkpointing.warm_start({'model': target}, str(tmp_path / 'ckpt-5'))
  np.testing.assert_array_equal(target.weights[0].numpy(), 7.0)
  with pytest.raises(errors.CtlError, match='Cannot warm-start'):
    checkpointing.warm_start({'model': _model(width=4)},
                             str(tmp_path / 'ckpt-5'))


def test_data_positions_resume_the_next_batches(tmp_path):
  dataset = tf.data.Dataset.range(100).shuffle(50, seed=1).batch(4)
  iterator = iter(dataset)
  positions = checkpointing.DataPositions(
      {'iterator': iterator}, str(tmp_path), worker='worker:1', max_to_keep=2)
  positions.check_savable()
  for step in range(1, 4):
    next(iterator)
    positions.save(step)
  expected = [next(iterator).numpy() for _ in range(3)]
  # Two kept, in the worker's own directory.
  assert sorted(path.name for path in (tmp_path / 'worker:1').glob(
      '*.index')) == ['ckpt-2.index', 'ckpt-3.index']
  resumed = iter(dataset)
  checkpointing.DataPositions(
      {'iterator': resumed}, str(tmp_path), worker='worker:1',
      max_to_keep=2).restore(3)
  for batch in expected:
    np.testing.assert_array_equal(next(resumed).numpy(), batch)
  with pytest.raises(errors.CtlError, match='data position of step 1 is '
                     'missing'):
    positions.restore(1)


def test_a_pipeline_with_a_stateful_op_is_refused_naming_it(tmp_path):
  dataset = tf.data.Dataset.range(10).map(
      lambda x: tf.cast(x, tf.float32) + tf.random.uniform([]))
  positions = checkpointing.DataPositions(
      {'iterator': iter(dataset)}, str(tmp_path), worker='single',
      max_to_keep=1)
  with pytest.raises(errors.CtlError, match='RandomUniform is stateful'):
    positions.check_savable()


def test_positions_saved_by_another_number_of_workers_are_refused(tmp_path):
  def positions(num_workers):
    return checkpointing.DataPositions(
        {'iterator': iter(tf.data.Dataset.range(10))}, str(tmp_path),
        worker='worker:0', max_to_keep=1, num_workers=num_workers)

  positions(2).save(4)
  positions(2).restore(4)
  with pytest.raises(errors.CtlError, match='saved by 2 worker.s., and this '
                     'job has 3'):
    positions(3).restore(4)


def test_a_checkpoint_without_every_workers_data_position_is_not_latest(
    tmp_path):
  positions = {
      worker: checkpointing.DataPositions(
          {'iterator': iter(tf.data.Dataset.range(10))},
          str(tmp_path / 'data'), worker=worker, max_to_keep=3,
          num_workers=2, all_workers=('worker:0', 'worker:1'))
      for worker in ('worker:0', 'worker:1')}
  saver = _checkpointer(tmp_path, _model(),
                        is_whole=positions['worker:0'].is_whole)
  positions['worker:0'].save(1)
  positions['worker:1'].save(1)
  saver.save(1)
  # worker:1 was killed before it wrote its position of step 2.
  positions['worker:0'].save(2)
  saver.save(2)
  restorer = _checkpointer(tmp_path, _model(),
                           is_whole=positions['worker:1'].is_whole)
  assert restorer.restore_latest().endswith('ckpt-1')
