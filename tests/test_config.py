"""Every shipped config loads and validates; validate() rejects what cannot work."""

import importlib.util

import pytest

from ctl import config as config_lib
from ctl import config_checks
from ctl import errors
import helpers

CONFIGS = sorted((helpers.REPO / 'configs').glob('*.py'))


def _load(path):
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_there_are_configs():
  assert {path.stem for path in CONFIGS} >= {'digits', 'mnist'}


@pytest.mark.parametrize('path', CONFIGS, ids=lambda path: path.stem)
def test_config_loads_validates_and_documents_its_command(path):
  module = _load(path)
  config = module.get_config()
  config_lib.validate(config)
  assert module.get_config.__doc__.startswith('python -m ctl.main --config=')
  # Every framework field, whatever the task adds.
  assert set(config_checks.leaves(config_lib.base_config().to_dict())) <= set(
      config_checks.leaves(config.to_dict()))


@pytest.mark.parametrize('path', CONFIGS, ids=lambda path: path.stem)
def test_every_config_has_a_short_smoke_variant(path):
  module = _load(path)
  smoke = module.get_config('smoke')
  config_lib.validate(smoke)
  assert smoke.to_dict() != module.get_config().to_dict()
  with pytest.raises(ValueError, match='Unknown variant'):
    module.get_config('nope')


def test_a_config_without_a_task_is_an_error():
  with pytest.raises(errors.ConfigError, match='Set config.task'):
    config_lib.validate(config_lib.base_config())


@pytest.mark.parametrize('key, value, message', [
    ('batch_size', 0, 'batch_size=0 must be at least 1'),
    ('steps_per_loop', 0, 'steps_per_loop=0 must be at least 1'),
    ('intervals.checkpoint_steps', -1, 'must not be negative'),
    ('optimizer.learning_rate', 0.0, 'must be positive'),
    ('diagnostics.straggler_seconds', 0.0,
     'straggler_seconds=0.0 must be positive'),
    ('optimizer.schedule', 'cosin', "must be one of ['constant'"),
    ('distribution.strategy', 'tpu', 'distribution.strategy'),
    ('distribution.collective', 'ring', "'AUTO', 'RING', 'NCCL'"),
    ('data.eval_fraction', 1.0, 'between 0 and 1'),
])
def test_validate_names_the_bad_field(key, value, message):
  config = config_lib.classification_config()
  section, _, field = key.rpartition('.')
  (config[section] if section else config)[field] = value
  with pytest.raises(errors.ConfigError, match=message.replace('[', r'\[')):
    config_lib.validate(config)


def test_nothing_to_train_is_an_error():
  config = config_lib.classification_config()
  config.num_epochs = 0
  with pytest.raises(errors.ConfigError, match='num_epochs or total_steps'):
    config_lib.validate(config)


def test_differences_lists_changed_leaves():
  old = config_lib.classification_config().to_dict()
  new = config_lib.classification_config()
  new.optimizer.learning_rate = 0.5
  new.metrics = ('accuracy', 'top5_accuracy')
  import json  # pylint: disable=g-import-not-at-top
  changes = config_checks.differences(json.loads(json.dumps(old)),
                                   json.loads(new.to_json()))
  assert changes == [
      "metrics: ['accuracy'] -> ['accuracy', 'top5_accuracy']",
      'optimizer.learning_rate: 0.001 -> 0.5',
  ]


def test_a_builder_named_by_its_module_before_the_fold_still_resolves():
  # ctl.builtin_tasks.models (and optimizers, losses, metrics) became
  # ctl.builtin_tasks.classification: a config naming the old path still
  # trains, with a warning saying what to write.
  from ctl.builtin_tasks import classification  # pylint: disable=g-import-not-at-top
  with pytest.warns(errors.CtlDeprecationWarning,
                    match="write 'ctl.builtin_tasks.classification:cnn'"):
    builder = config_checks.resolve_builder('ctl.builtin_tasks.models:cnn',
                                            {}, 'model')
  assert builder is classification.cnn
  with pytest.raises(errors.ConfigError, match='Cannot import module'):
    config_checks.resolve_builder('ctl.builtin_tasks.nope:cnn', {}, 'model')
