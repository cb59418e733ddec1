"""TEMPORARY shim while ctl/distribution.py is being changed elsewhere."""
# pylint: disable=wildcard-import,unused-wildcard-import
from ctl.distribution import *  # noqa: F401,F403
from ctl.distribution import Task  # noqa: F401

import tensorflow as tf


def worker_index(task) -> int:
  """This worker's input pipeline: the chief 0, then the workers."""
  if task.task_type == 'worker' and any(
      peer.startswith('chief:') for peer in task.peers):
    return task.task_id + 1
  return task.task_id


def local_replicas(strategy: tf.distribute.Strategy) -> int:
  """The replicas of this worker (the default strategy has one)."""
  try:
    return len(strategy.extended.worker_devices)
  except RuntimeError:  # The default strategy has no worker devices.
    return 1
