"""The chief is chosen as TensorFlow's multi-worker tutorials choose it."""

import pytest
import tensorflow as tf

from ctl import distribution

WORKERS = {'worker': ['localhost:1', 'localhost:2']}
WITH_CHIEF = {'chief': ['localhost:0'], **WORKERS}


@pytest.mark.parametrize('cluster, task_type, task_id, expected', [
    ({}, None, 0, True),  # A single process is its own chief.
    (WORKERS, 'worker', 0, True),
    (WORKERS, 'worker', 1, False),
    (WITH_CHIEF, 'chief', 0, True),
    (WITH_CHIEF, 'worker', 0, False),
    (WITH_CHIEF, 'worker', 1, False),
    (WORKERS, 'evaluator', 0, False),
])
def test_is_chief(cluster, task_type, task_id, expected):
  assert distribution.is_chief(task_type, task_id,
                               tf.train.ClusterSpec(cluster)) is expected


@pytest.mark.parametrize('kind, strategy_type', [
    ('auto', type(tf.distribute.get_strategy())),  # This machine has no GPU.
    ('default', type(tf.distribute.get_strategy())),
    ('one_device', tf.distribute.OneDeviceStrategy),
])
def test_one_process_without_tf_config(monkeypatch, kind, strategy_type):
  monkeypatch.delenv('TF_CONFIG', raising=False)
  from ctl import config as config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.base_config().distribution
  config.strategy = kind
  strategy, task = distribution.build_strategy(config)
  assert type(strategy) is strategy_type  # pylint: disable=unidiomatic-typecheck
  assert task == distribution.Task(None, 0, 1, True)


def test_multi_worker_without_a_cluster_is_a_config_error(monkeypatch):
  monkeypatch.delenv('TF_CONFIG', raising=False)
  from ctl import config as config_lib  # pylint: disable=g-import-not-at-top
  from ctl import errors  # pylint: disable=g-import-not-at-top
  config = config_lib.base_config().distribution
  config.strategy = 'multi_worker'
  with pytest.raises(errors.ConfigError, match='is TF_CONFIG set'):
    distribution.build_strategy(config)
