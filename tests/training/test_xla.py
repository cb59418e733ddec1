"""What XLA compiles (config.jit_compile), and that every choice trains alike."""

import keras
import pytest

from ctl import errors
from ctl import task as task_lib
from ctl.training import run
from ctl.training import steps
import helpers


def _model(*layers):
  return keras.Sequential([keras.Input((8, 8, 1)), *layers,
                           keras.layers.Flatten(), keras.layers.Dense(10)])


class _Task(task_lib.Task):
  """A task holding one model; only its attributes matter here."""

  def __init__(self, model, auto_xla=True):
    super().__init__(helpers.digits())
    self.model = model
    self.auto_xla = auto_xla


@pytest.mark.parametrize('setting, num_replicas, in_memory, layers, expected', [
    ('auto', 1, True, [], 'loop'),
    ('auto', 1, True, [keras.layers.Conv2D(4, 3)], 'step'),
    ('auto', 1, True, [keras.layers.DepthwiseConv2D(3)], 'step'),
    ('auto', 1, False, [], 'step'),  # A tf.data iterator cannot be compiled.
    ('auto', 2, True, [], 'off'),
    ('off', 1, True, [], 'off'),
    ('loop', 1, True, [keras.layers.Conv2D(4, 3)], 'loop'),
])
def test_resolve_jit_compile(setting, num_replicas, in_memory, layers,
                             expected):
  # Nested models count: their convolutions are found too.
  model = keras.Sequential([keras.Input((8, 8, 1)), _model(*layers)])
  assert steps.resolve_xla(setting, num_replicas=num_replicas,
                           task=_Task(model), in_memory=in_memory) == expected


def test_auto_leaves_a_users_own_steps_alone():
  assert steps.resolve_xla('auto', num_replicas=1, in_memory=True,
                           task=_Task(_model(), auto_xla=False)) == 'off'


@pytest.mark.parametrize('setting, num_replicas, in_memory, message', [
    ('loop', 2, True, "'loop' needs a single replica"),
    ('step', 2, True, "'step' needs a single replica"),
    ('loop', 1, False, "'loop' needs in-memory training data"),
])
def test_impossible_choices_are_config_errors(setting, num_replicas,
                                              in_memory, message):
  with pytest.raises(errors.ConfigError, match=message):
    steps.resolve_xla(setting, num_replicas=num_replicas,
                      task=_Task(_model()), in_memory=in_memory)


def _digits(num_epochs, **fields):
  return helpers.digits(num_epochs, steps_per_epoch=20, deterministic=True,
                        **fields)


@pytest.fixture(scope='module')
def plain(tmp_path_factory):
  """plain(model): the workdir and results of its run without XLA, run
  once a module for the choices it is compared with."""
  runs = {}

  def plain_run(model: str):
    if model not in runs:
      workdir = tmp_path_factory.mktemp(f'plain_{model}')
      runs[model] = workdir, run.train_and_evaluate(
          _digits(2, jit_compile='off', **{'model.name': model}),
          str(workdir))
    return runs[model]

  return plain_run


@pytest.mark.slow
@pytest.mark.parametrize('model, jit_compile', [
    ('mlp', 'loop'), ('mlp', 'step'), ('cnn', 'step'), ('cnn', 'loop')])
def test_every_choice_trains_what_plain_tensorflow_trains(tmp_path, plain,
                                                          model, jit_compile):
  plain_workdir, plain_results = plain(model)
  compiled = run.train_and_evaluate(
      _digits(2, jit_compile=jit_compile, **{'model.name': model}),
      str(tmp_path / 'xla'))
  # XLA ran.
  assert compiled['weights_sha256'] != plain_results['weights_sha256']
  # The same arithmetic, rounded differently (padded rows of a loop, say,
  # would move the weights far more).
  helpers.assert_same_model(tmp_path / 'xla/checkpoints/ckpt-40',
                            plain_workdir / 'checkpoints/ckpt-40', atol=1e-4)


# Each of XLA's two ways, and each model, once (mlp with 'loop' compiles
# the slowest, 2-3 times the others); that XLA trains every pair alike:
# test_every_choice_trains_what_plain_tensorflow_trains.
@pytest.mark.slow
@pytest.mark.parametrize('model, jit_compile', [('mlp', 'step'),
                                                ('cnn', 'loop')])
def test_every_choice_resumes_bit_identical_random_layers_included(
    tmp_path, model, jit_compile):
  # XLA draws dropout masks of its own: the random state must resume too.
  # A constant learning rate: 1 epoch then 2 follows 2 epochs' schedule.
  fields = {'model.name': model, 'model.dropout': 0.3,
            'jit_compile': jit_compile, 'optimizer.schedule': 'constant'}
  uninterrupted = run.train_and_evaluate(_digits(2, **fields),
                                           str(tmp_path / 'uninterrupted'))
  run.train_and_evaluate(_digits(1, **fields), str(tmp_path / 'resumed'))
  resumed = run.train_and_evaluate(_digits(2, **fields),
                                     str(tmp_path / 'resumed'))
  assert resumed['weights_sha256'] == uninterrupted['weights_sha256']


@pytest.mark.slow
def test_a_model_xla_cannot_compile_fails_clearly_and_trains_without_xla(
    tmp_path):
  fields = {'model.name': 'user_modules:not_xla', 'jit_compile': 'auto'}
  with pytest.raises(errors.CtlError, match='XLA cannot compile') as error:
    run.train_and_evaluate(_digits(1, **fields), str(tmp_path / 'auto'))
  assert '--config.jit_compile=off' in str(error.value)
  assert 'PyFunc' in str(error.value)
  assert not list((tmp_path / 'auto').glob('checkpoints/*'))
  fields['jit_compile'] = 'off'
  results = run.train_and_evaluate(_digits(1, **fields),
                                     str(tmp_path / 'off'))
  assert results['step'] == 20
