"""Partial warm start (config.init_select) and the fine-tuning example:
a pretrained backbone under a new head, frozen for its first steps."""

import numpy as np
import pytest

import ctl
from ctl import errors
from ctl.training import run
import helpers

CONFIG = helpers.REPO / 'configs' / 'finetune.py'


def _config(variant='', **fields):
  config = helpers.load_config_file(CONFIG, variant)
  return helpers.override(config, num_epochs=1, **fields)


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('pretrain')
  run.train_and_evaluate(_config('pretrain'), str(workdir))
  return workdir


def _backbone(workdir, checkpoint='latest') -> list[np.ndarray]:
  return ctl.load(str(workdir), checkpoint).models['backbone'].get_weights()


def test_the_backbone_is_restored_frozen_then_trained_and_the_head_is_new(
    pretrained, tmp_path, caplog):
  caplog.set_level('INFO')
  run.train_and_evaluate(
      _config(init_from=str(pretrained), **{
          'finetune.freeze_steps': 10, 'intervals.checkpoint_steps': 10,
          'intervals.keep_checkpoints': 10}), str(tmp_path))
  assert ('restored backbone (4 variables); left as initialised: head'
          in caplog.text)
  source = _backbone(pretrained)
  frozen = _backbone(tmp_path, str(tmp_path / 'checkpoints' / 'ckpt-10'))
  trained = _backbone(tmp_path, str(tmp_path / 'checkpoints' / 'ckpt-20'))
  for before, after in zip(source, frozen):
    np.testing.assert_array_equal(before, after)
  assert any((before != after).any() for before, after in zip(source, trained))
  assert helpers.read_results(tmp_path)['eval']['accuracy'] > 0.3


def test_a_selected_part_that_does_not_fit_is_a_clear_error(
    pretrained, tmp_path):
  # The pretrained head has 5 classes, this one 10.
  with pytest.raises(errors.CtlError,
                     match=r"Cannot warm-start 'head' from .*shape"):
    run.train_and_evaluate(
        _config(init_from=str(pretrained), init_select=('backbone', 'head')),
        str(tmp_path))
  assert not (tmp_path / 'checkpoints').exists()


def test_a_selected_name_the_task_lacks_is_a_config_error(pretrained,
                                                         tmp_path):
  with pytest.raises(errors.ConfigError, match="'neck'.*'backbone', 'head'"):
    run.train_and_evaluate(
        _config(init_from=str(pretrained), init_select=('neck',)),
        str(tmp_path))


def test_a_new_head_without_init_select_names_init_select(pretrained,
                                                          tmp_path):
  # Every model is restored by default: the new head (10 classes, the
  # pretrained one 5) does not fit, and the error says how to leave it out,
  # without the checkpoint's values.
  config = _config(init_from=str(pretrained))
  config.init_select = ()
  with pytest.raises(errors.CtlError) as raised:
    run.train_and_evaluate(config, str(tmp_path))
  message = str(raised.value)
  print(message)
  assert "Cannot warm-start 'head'" in message
  assert '--config.init_select=backbone' in message
  assert 'numpy=' not in message and len(message) < 700
  assert not (tmp_path / 'checkpoints').exists()
