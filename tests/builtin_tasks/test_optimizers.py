"""Learning-rate schedules follow the config: warm-up, then the decay."""

import numpy as np
import pytest

from ctl import config as config_lib
from ctl.builtin_tasks import classification


def _schedule(total_steps=100, **fields):
  config = config_lib.classification_config().optimizer
  config.update(fields)
  return classification.build_schedule(config, total_steps)


def _values(schedule, steps):
  return np.array([float(schedule(step)) for step in steps])


def test_constant_is_a_plain_float():
  assert _schedule(learning_rate=0.1) == 0.1


@pytest.mark.parametrize('schedule', ['cosine', 'linear'])
def test_decays_from_peak_to_end_factor(schedule):
  values = _values(_schedule(learning_rate=0.1, schedule=schedule,
                             end_learning_rate_factor=0.1), [0, 50, 100])
  np.testing.assert_allclose(values[[0, 2]], [0.1, 0.01], rtol=1e-5)
  assert values[0] > values[1] > values[2]


def test_warmup_rises_linearly_then_decays():
  schedule = _schedule(learning_rate=0.1, schedule='cosine', warmup_steps=10)
  warming = _values(schedule, range(10))
  np.testing.assert_allclose(warming, 0.01 * np.arange(1, 11), rtol=1e-5)
  after = _values(schedule, [10, 55, 100])
  np.testing.assert_allclose(after[0], 0.1, rtol=1e-5)
  assert after[0] > after[1] > after[2]


@pytest.mark.parametrize('name', ['adam', 'adamw', 'sgd', 'rmsprop'])
def test_builds_each_named_optimizer(name):
  config = config_lib.classification_config().optimizer
  config.name = name
  optimizer = classification.build_optimizer(config, total_steps=10)
  assert type(optimizer).__name__.lower() == name
