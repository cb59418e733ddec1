"""build_strategy: the chief, the strategy, and TF_CONFIG checked before any server."""

import json

import pytest
import tensorflow as tf

from ctl.cluster import tf_config as cluster_lib
from ctl.cluster import distribution
from ctl.training import failures

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
  assert cluster_lib.is_chief(task_type, task_id, list(cluster)) is expected


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
  assert task == distribution.Role(None, 0, 1, True)


def test_multi_worker_without_a_cluster_is_a_config_error(monkeypatch):
  monkeypatch.delenv('TF_CONFIG', raising=False)
  from ctl import config as config_lib  # pylint: disable=g-import-not-at-top
  from ctl import errors  # pylint: disable=g-import-not-at-top
  config = config_lib.base_config().distribution
  config.strategy = 'multi_worker'
  with pytest.raises(errors.ConfigError, match='set TF_CONFIG, or run under srun'):
    distribution.build_strategy(config)


def _distribution_config(strategy='auto'):
  from ctl import config as config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.base_config().distribution
  config.strategy = strategy
  return config


@pytest.mark.parametrize('tf_config, message', [
    ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker"}}',
     '"task" has no "index"'),
    ('not json', 'TF_CONFIG is not JSON'),
])
def test_a_malformed_tf_config_fails_before_any_server_starts(
    monkeypatch, tf_config, message):
  from ctl import errors  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('TF_CONFIG', tf_config)
  with pytest.raises(errors.ConfigError, match=message):
    distribution.build_strategy(_distribution_config())


def test_an_evaluator_task_gets_its_own_devices_outside_training(monkeypatch):
  monkeypatch.setenv('TF_CONFIG', json.dumps({
      'cluster': {'worker': ['localhost:1'], 'evaluator': ['localhost:2']},
      'task': {'type': 'evaluator', 'index': 0}}))
  strategy, task = distribution.build_strategy(_distribution_config())
  # No server started, no collective: the default strategy of this process.
  assert type(strategy) is type(tf.distribute.get_strategy())  # pylint: disable=unidiomatic-typecheck
  assert task.task_type == 'evaluator' and not task.is_chief
  assert task.num_workers == 1 and not task.peers


@pytest.mark.parametrize('tf_config', ['{}', '{"cluster": {}}'])
def test_tf_config_without_a_cluster_runs_one_process(monkeypatch, tf_config):
  monkeypatch.setenv('TF_CONFIG', tf_config)
  strategy, task = distribution.build_strategy(_distribution_config())
  assert type(strategy) is type(tf.distribute.get_strategy())  # pylint: disable=unidiomatic-typecheck
  assert task == distribution.Role(None, 0, 1, True)


# TensorFlow's own words (coordination_service.cc, CheckHeartbeatTimeout).
_HEARTBEAT_LOST = (
    'The following tasks are unhealthy (stopped sending heartbeats):\n'
    '/job:worker/replica:0/task:1\nThe tasks have crashed. Check the task '
    'logs for an earlier error, or scheduler events (e.g. preemption, '
    'eviction) to debug further.')


@pytest.mark.parametrize('error, expected', [
    (tf.errors.DeadlineExceededError(
        None, None, 'ctl: no progress for distribution.timeout_seconds=60'),
     'this worker made no progress for distribution.timeout_seconds=60 (its '
     'watchdog ended the wait)'),
    (tf.errors.UnavailableError(None, None, _HEARTBEAT_LOST),
     "TensorFlow's coordination service found a worker silent for its "
     'heartbeat timeout, 120 s (2 x distribution.timeout_seconds=60): it '
     'died, was stopped or is cut off (TensorFlow: The following tasks are unhealthy (stopped '
     'sending heartbeats): /job:worker/replica:0/task:1 '),
    (tf.errors.UnavailableError(None, None, 'Socket closed'),
     'a connection to another worker failed: it died, exited or was killed '
     '(TensorFlow: Socket closed)'),
], ids=['watchdog', 'heartbeat', 'connection'])
def test_a_lost_peer_is_explained_by_what_noticed_it_and_its_timeout(
    error, expected):
  message = str(failures.peer_failure(error, '/tmp/run', 60.0))
  assert message.startswith(
      f'Lost the other workers ({type(error).__name__}): {expected}'), message
