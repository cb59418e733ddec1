"""TensorFlow's coordination service, with the timeouts the user set.

MultiWorkerMirroredStrategy would configure the service with TensorFlow's
defaults, which act before ctl's own timeouts (BUILD.md, "The timeouts a
user sets are TensorFlow's too"): a worker silent for 10 s failed the job
whatever `distribution.timeout_seconds` said, and a peer that never
registered was waited for an hour. `configure` sets them from the
`distribution` config before the strategy is built.
"""

import time

import ml_collections
import tensorflow as tf

from ctl import errors
from ctl.cluster import tf_config as cluster_lib
from ctl.runtime import tf_cluster_internals

# The service fails the job when a worker sends no heartbeat for this many
# distribution.timeout_seconds. Each worker's heartbeat RPC to the service
# (on the chief) may take half that before it fails the job, so a chief
# frozen for less than the timeout costs time, not the job; a peer frozen
# for longer meets the watchdog (ctl/cluster/watchdog.py) first.
HEARTBEAT_TIMEOUTS = 2
# The least time TensorFlow's own registration is given, however much of
# distribution.startup_timeout_seconds ctl's wait took.
_MIN_REGISTER_SECONDS = 10.0
# What "wait for ever" (a timeout of 0) means to TensorFlow's timeouts,
# which read 0 as their defaults: a week.
_FOREVER_SECONDS = 7 * 24 * 3600.0


def configure(cluster_spec: tf.train.ClusterSpec,
              config: ml_collections.ConfigDict, started: float) -> float:
  """Sets the service up for the strategy about to be built.

  Args:
    cluster_spec: the training tasks.
    config: the `distribution` section.
    started: when this task began to wait for the cluster (monotonic).

  Returns:
    How long TensorFlow waits for every task to register, in seconds.
  """
  register_seconds = _register_seconds(config.startup_timeout_seconds,
                                       started)
  tf_cluster_internals.configure_coordination_service(
      cluster_spec,
      heartbeat_timeout_ms=int(
          1000 * heartbeat_timeout_seconds(config.timeout_seconds)),
      register_timeout_ms=int(1000 * register_seconds))
  return register_seconds


def heartbeat_timeout_seconds(timeout_seconds: float) -> float:
  """TensorFlow's heartbeat timeout for distribution.timeout_seconds (0:
  for ever, a week to TensorFlow)."""
  return HEARTBEAT_TIMEOUTS * (timeout_seconds or _FOREVER_SECONDS)


def _register_seconds(startup_timeout: float, started: float) -> float:
  """What is left of the start-up timeout (0: for ever), at least
  _MIN_REGISTER_SECONDS."""
  if not startup_timeout:
    return _FOREVER_SECONDS
  left = startup_timeout - (time.monotonic() - started)
  return max(left, _MIN_REGISTER_SECONDS)


def not_registered(cluster: cluster_lib.Cluster, startup_timeout: float,
                   register_seconds: float,
                   error: tf.errors.OpError) -> errors.PeerFailure:
  """The error for a cluster whose TensorFlow part did not form: a peer
  that had started was gone (killed?) before it registered."""
  return errors.PeerFailure(
      'The cluster did not form: every peer had started, but not all '
      "registered with TensorFlow's coordination service within "
      f'{register_seconds:.0f} s (what was left of distribution.'
      f'startup_timeout_seconds={startup_timeout:g}); a peer was killed or '
      f'stopped as it joined ({type(error).__name__}: '
      f'{errors.op_reason(error)[:300]}). This task ({cluster.task_name}) '
      'gives up without training; restart all workers of the job together.')
