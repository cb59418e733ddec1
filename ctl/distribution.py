"""Builds the tf.distribute strategy and says which task this process is."""

import dataclasses

from absl import logging
import ml_collections
import tensorflow as tf

from ctl import errors

_RESOLVERS = {
    'tf_config': tf.distribute.cluster_resolver.TFConfigClusterResolver,
}


@dataclasses.dataclass(frozen=True)
class Task:
  """This process's place in the job."""

  task_type: str | None  # None for a single process.
  task_id: int
  num_workers: int
  is_chief: bool  # The chief alone writes checkpoints, summaries and results.
  # The job's other tasks, as 'worker:1'; none for a single process.
  peers: tuple[str, ...] = ()

  @property
  def name(self) -> str:
    return f'{self.task_type}:{self.task_id}' if self.task_type else 'single'


def is_chief(task_type: str | None, task_id: int,
             cluster_spec: tf.train.ClusterSpec) -> bool:
  """Decides the chief as TensorFlow's multi-worker tutorials do.

  The task of type 'chief' is the chief; without one, worker 0 is; a single
  process (no task type) is its own chief.
  """
  if not task_type or task_type == 'chief':
    return True
  return (task_type == 'worker' and task_id == 0 and
          'chief' not in cluster_spec.jobs)


def build_strategy(
    config: ml_collections.ConfigDict
) -> tuple[tf.distribute.Strategy, Task]:
  """Builds the strategy named by config (the `distribution` section).

  Must run before any other TensorFlow op: a multi-worker strategy configures
  the runtime and waits here until every worker of the cluster has started.
  """
  resolver = _RESOLVERS[config.cluster_resolver]()
  cluster_spec = resolver.cluster_spec()
  kind = _choose_kind(config.strategy, has_cluster=bool(cluster_spec.jobs))
  if kind == 'multi_worker':
    if not cluster_spec.jobs:
      raise errors.ConfigError(
          "distribution.strategy='multi_worker' needs a cluster, but "
          f'{config.cluster_resolver!r} found none (is TF_CONFIG set?).')
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver,
        communication_options=_communication_options(config))
    tasks = [f'{job}:{index}' for job in ('chief', 'worker')
             if job in cluster_spec.jobs
             for index in range(cluster_spec.num_tasks(job))]
    task = Task(
        task_type=resolver.task_type,
        task_id=resolver.task_id,
        num_workers=len(tasks),
        is_chief=is_chief(resolver.task_type, resolver.task_id, cluster_spec))
    return strategy, dataclasses.replace(
        task, peers=tuple(name for name in tasks if name != task.name))
  if kind == 'mirrored':
    strategy = tf.distribute.MirroredStrategy(_local_devices())
  elif kind == 'one_device':
    gpus = tf.config.list_logical_devices('GPU')
    strategy = tf.distribute.OneDeviceStrategy(
        gpus[0].name if gpus else '/cpu:0')
  else:
    strategy = tf.distribute.get_strategy()
  return strategy, Task(task_type=None, task_id=0, num_workers=1,
                        is_chief=True)


def leave_together(task: Task, timeout_seconds: float) -> None:
  """Returns once this worker can exit without failing the others.

  ctl exits without TensorFlow's shutdown, which takes seconds (ctl/main.py),
  and with it skips its wait for the other workers: a worker that exits
  while a peer still receives its part of the last collective fails that
  peer ("Socket closed"). So every worker first waits at a barrier (then
  every collective is complete everywhere), and the chief, which hosts the
  coordination service holding the barrier, leaves last: once every other
  worker has said it got past it. A failure here is logged, not raised:
  this worker's work is done.

  Args:
    task: this process's place in the job.
    timeout_seconds: how long to wait for the others; 0 waits a day.
  """
  if not task.peers:
    return
  # The coordination service's barrier and key-value store: TensorFlow's own
  # (tf.distribute's failure handling uses them), with no public API.
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  coordination = context.context()
  timeout_ms = int(1000 * (timeout_seconds or 24 * 3600))
  try:
    coordination.wait_at_barrier('ctl/exit', timeout_ms)
    if task.is_chief:
      for peer in task.peers:
        coordination.get_config_key_value(f'ctl/left/{peer}', timeout_ms)
    else:
      coordination.set_config_key_value(f'ctl/left/{task.name}', 'left')
  except tf.errors.OpError as error:
    logging.warning('Not all workers reached the end together: %s',
                    error.message.strip().splitlines()[0])


def _local_devices() -> list[str]:
  """Every local GPU; without GPUs, every logical CPU device.

  A machine has one logical CPU device unless the program splits it
  (tf.config.set_logical_device_configuration), as the tests do to run
  several replicas in one process.
  """
  devices = (tf.config.list_logical_devices('GPU') or
             tf.config.list_logical_devices('CPU'))
  return [device.name for device in devices]


def _choose_kind(strategy: str, has_cluster: bool) -> str:
  """Resolves 'auto' to a concrete strategy kind."""
  if strategy != 'auto':
    return strategy
  if has_cluster:
    return 'multi_worker'
  num_gpus = len(tf.config.list_physical_devices('GPU'))
  if num_gpus > 1:
    return 'mirrored'
  # One GPU: OneDeviceStrategy puts the step on it. On a CPU alone it adds
  # nothing (and measured no faster, BENCHMARKS.md), so the default
  # strategy runs the step as written.
  return 'one_device' if num_gpus == 1 else 'default'


def _communication_options(
    config: ml_collections.ConfigDict
) -> tf.distribute.experimental.CommunicationOptions:
  implementation = getattr(tf.distribute.experimental.CommunicationImplementation,
                           config.collective)
  return tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=config.bytes_per_pack,
      implementation=implementation,
      timeout_seconds=config.timeout_seconds or None)
