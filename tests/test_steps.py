"""What XLA compiles (config.jit_compile), and that every choice trains alike."""

import keras
import pytest

from ctl import errors
from ctl import steps as steps_lib
from ctl import train
import helpers


def _model(*layers):
  return keras.Sequential([keras.Input((8, 8, 1)), *layers,
                           keras.layers.Flatten(), keras.layers.Dense(10)])


@pytest.mark.parametrize('setting, num_replicas, layers, expected', [
    ('auto', 1, [], 'loop'),
    ('auto', 1, [keras.layers.Conv2D(4, 3)], 'step'),
    ('auto', 1, [keras.layers.DepthwiseConv2D(3)], 'step'),
    ('auto', 2, [], 'off'),
    ('off', 1, [], 'off'),
    ('step', 2, [], 'step'),
    ('loop', 1, [keras.layers.Conv2D(4, 3)], 'loop'),
])
def test_resolve_jit_compile(setting, num_replicas, layers, expected):
  # Nested models count: their convolutions are found too.
  model = keras.Sequential([keras.Input((8, 8, 1)), _model(*layers)])
  assert steps_lib.resolve_jit_compile(
      setting, num_replicas=num_replicas, model=model) == expected


def test_a_loop_compiled_whole_needs_one_replica():
  with pytest.raises(errors.ConfigError, match="'loop' needs a single"):
    steps_lib.resolve_jit_compile('loop', num_replicas=2, model=_model())


def _digits(num_epochs, **fields):
  config = helpers.load_config('digits')
  config.num_epochs = num_epochs
  config.steps_per_epoch = 20
  config.deterministic = True
  for key, value in fields.items():
    section, _, field = key.rpartition('.')
    (config[section] if section else config)[field] = value
  return config


@pytest.mark.parametrize('model, jit_compile', [
    ('mlp', 'loop'), ('mlp', 'step'), ('cnn', 'step'), ('cnn', 'loop')])
def test_every_choice_trains_what_plain_tensorflow_trains(tmp_path, model,
                                                          jit_compile):
  fields = {'model.name': model}
  plain = train.train_and_evaluate(_digits(2, jit_compile='off', **fields),
                                   str(tmp_path / 'plain'))
  compiled = train.train_and_evaluate(
      _digits(2, jit_compile=jit_compile, **fields), str(tmp_path / 'xla'))
  assert compiled['weights_sha256'] != plain['weights_sha256']  # XLA ran.
  # The same arithmetic, rounded differently (padded rows of a loop, say,
  # would move the weights far more).
  helpers.assert_same_model(tmp_path / 'xla/checkpoints/ckpt-40',
                            tmp_path / 'plain/checkpoints/ckpt-40', atol=1e-4)


@pytest.mark.parametrize('model, jit_compile', [
    ('mlp', 'loop'), ('mlp', 'step'), ('cnn', 'step'), ('cnn', 'loop')])
def test_every_choice_resumes_bit_identical_random_layers_included(
    tmp_path, model, jit_compile):
  # XLA draws dropout masks of its own: the random state must resume too.
  # A constant learning rate: 1 epoch then 2 follows 2 epochs' schedule.
  fields = {'model.name': model, 'model.dropout': 0.3,
            'jit_compile': jit_compile, 'optimizer.schedule': 'constant'}
  uninterrupted = train.train_and_evaluate(_digits(2, **fields),
                                           str(tmp_path / 'uninterrupted'))
  train.train_and_evaluate(_digits(1, **fields), str(tmp_path / 'resumed'))
  resumed = train.train_and_evaluate(_digits(2, **fields),
                                     str(tmp_path / 'resumed'))
  assert resumed['weights_sha256'] == uninterrupted['weights_sha256']


def test_a_model_xla_cannot_compile_fails_clearly_and_trains_without_xla(
    tmp_path):
  fields = {'model.name': 'user_modules:not_xla', 'jit_compile': 'auto'}
  with pytest.raises(errors.CtlError, match='XLA cannot compile') as error:
    train.train_and_evaluate(_digits(1, **fields), str(tmp_path / 'auto'))
  assert '--config.jit_compile=off' in str(error.value)
  assert 'PyFunc' in str(error.value)
  assert not list((tmp_path / 'auto').glob('checkpoints/*'))
  fields['jit_compile'] = 'off'
  results = train.train_and_evaluate(_digits(1, **fields),
                                     str(tmp_path / 'off'))
  assert results['step'] == 20
