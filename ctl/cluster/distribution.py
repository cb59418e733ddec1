"""Builds the tf.distribute strategy and says which task this process is.

A multi-worker start-up is bounded and can be stopped: before TensorFlow
starts its server, `build_strategy` checks TF_CONFIG and waits for every
peer in Python (ctl/cluster/tf_config.py says why TensorFlow's own wait cannot be
bounded or interrupted), within `distribution.startup_timeout_seconds`,
with SIGTERM stopping the wait (exit code 42: nothing was trained).
TensorFlow's coordination service is then set up with the user's
timeouts instead of its own (ctl/cluster/coordination.py).
"""

import dataclasses
import os
import signal
import threading
import time

from absl import logging
import ml_collections
import tensorflow as tf

from ctl.cluster import coordination
from ctl.cluster import tf_config as cluster_lib
from ctl.cluster import ps_cluster
from ctl.cluster import rendezvous
from ctl.cluster import slurm
from ctl.runtime import tf_cluster_internals
from ctl import errors


@dataclasses.dataclass(frozen=True)
class Role:
  """This process's place in the job."""

  task_type: str | None  # None for a single process.
  task_id: int
  num_workers: int
  is_chief: bool  # The chief alone writes checkpoints, summaries and results.
  # The job's other tasks, as 'worker:1'; none for a single process.
  peers: tuple[str, ...] = ()
  # Whether an evaluator task evaluates the chief's checkpoints instead.
  has_evaluator: bool = False

  @property
  def name(self) -> str:
    return f'{self.task_type}:{self.task_id}' if self.task_type else 'single'

  @property
  def worker_index(self) -> int:
    """This worker's input pipeline: the chief 0, then the workers."""
    if self.task_type == 'worker' and any(
        peer.startswith('chief:') for peer in self.peers):
      return self.task_id + 1
    return self.task_id


def build_strategy(
    config: ml_collections.ConfigDict
) -> tuple[tf.distribute.Strategy, Role]:
  """Builds the strategy named by config (the `distribution` section).

  Must run before any other TensorFlow op: a multi-worker strategy configures
  the runtime, and is only built once every worker of the cluster has
  started (see `_build_multi_worker`). The evaluator task of a cluster gets
  a strategy of its own devices: it is not part of the training collective.

  Raises:
    ConfigError: TF_CONFIG is malformed, or is missing for strategy
      'multi_worker'.
    PeerFailure: the cluster did not form within
      config.startup_timeout_seconds.
    Preempted: SIGTERM came while this task waited for the cluster.
    CtlError: this task cannot listen at its TF_CONFIG address.
  """
  cluster = read_cluster(config)
  has_ps = (cluster is not None and 'ps' in cluster.jobs and  # Only then
            ps_cluster.has_ps(cluster, config.strategy))  # runs ps_cluster.
  if cluster is not None and cluster.task_type == 'evaluator':
    logging.info('Cluster: this task is %s, the evaluator: it evaluates the '
                 "chief's checkpoints on its own devices, outside training.",
                 cluster.task_name)
    strategy = _local_strategy(_choose_kind(config.strategy,
                                            has_cluster=False))
    return strategy, Role(task_type='evaluator', task_id=cluster.task_index,
                          num_workers=1, is_chief=False)
  if _choose_kind(config.strategy, cluster is not None,
                  has_ps) == 'parameter_server':
    # To the loop, the chief (coordinator) is a job of one worker.
    return ps_cluster.build(config, cluster), Role(
        cluster.task_type, cluster.task_index, num_workers=1,
        is_chief=cluster.is_chief, has_evaluator=cluster.has_evaluator)
  kind = _choose_kind(config.strategy, has_cluster=cluster is not None)
  if kind == 'multi_worker':
    if cluster is None:
      raise errors.ConfigError(
          "distribution.strategy='multi_worker' needs a cluster, but "
          f'{config.cluster_resolver!r} found none: set TF_CONFIG, or run '
          'under srun (cluster_resolver auto or slurm).')
    return _build_multi_worker(config, cluster)
  # A single process waits for no one: its start-up needs no guard.
  return _local_strategy(kind), Role(task_type=None, task_id=0,
                                     num_workers=1, is_chief=True)


def is_parameter_server(strategy: tf.distribute.Strategy | None) -> bool:
  """Whether strategy coordinates parameter-server training."""
  return isinstance(strategy,
                    tf.distribute.experimental.ParameterServerStrategy)


def serve_parameter_server_task(config: ml_collections.ConfigDict,
                                workdir: str) -> dict:
  """A parameter-server job's worker or server task: serves until the
  chief marks the job done (ctl/cluster/ps_cluster.py)."""
  return ps_cluster.serve(config, workdir, read_cluster(config))


def local_strategy(config: ml_collections.ConfigDict
                   ) -> tf.distribute.Strategy:
  """A strategy of this process's devices only, whatever the cluster: for
  evaluation and export, which take no part in training's collective."""
  kind = 'auto' if config.strategy == 'multi_worker' else config.strategy
  return _local_strategy(_choose_kind(kind, has_cluster=False))


def _local_strategy(kind: str) -> tf.distribute.Strategy:
  """A strategy over this process's devices: 'mirrored', 'one_device' or
  'default'."""
  if kind == 'mirrored':
    return tf.distribute.MirroredStrategy(_local_devices())
  if kind == 'one_device':
    gpus = tf.config.list_logical_devices('GPU')
    return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else '/cpu:0')
  return tf.distribute.get_strategy()


def read_cluster(
    config: ml_collections.ConfigDict) -> cluster_lib.Cluster | None:
  """The cluster that config.cluster_resolver reads, checked; None for one
  process.

  'tf_config' reads TF_CONFIG (as Kubeflow's TFJob and ctl.launch set it);
  'slurm' the variables srun sets for each task (ctl/cluster/slurm.py);
  'auto' TF_CONFIG when it is set, else Slurm's variables when srun started
  this process, else none.
  """
  resolver = config.cluster_resolver
  if resolver == 'auto':
    if 'TF_CONFIG' in os.environ:
      resolver = 'tf_config'
    # srun gives each task its SLURM_PROCID: without it, no Slurm job step
    # to read (a one-device run asks nothing more of ctl/cluster/slurm.py).
    elif 'SLURM_PROCID' in os.environ and slurm.started_by_srun(os.environ):
      resolver = 'slurm'
    else:
      return None
  if resolver == 'slurm':
    return slurm.from_environment(os.environ, config.slurm_port_base,
                                  config.slurm_num_ps)
  return cluster_lib.from_tf_config(os.environ.get('TF_CONFIG'))


def _build_multi_worker(
    config: ml_collections.ConfigDict, cluster: cluster_lib.Cluster
) -> tuple[tf.distribute.Strategy, Role]:
  """Waits for the cluster to form, then builds MultiWorkerMirroredStrategy.

  The wait (rendezvous.wait_for_peers) is bounded by
  config.startup_timeout_seconds and ends on SIGTERM. TensorFlow's own wait
  inside the constructor then only lasts until the peers, which have all
  arrived, enter theirs.
  """
  timeout = config.startup_timeout_seconds
  with _StartUpSignal() as sigterm:
    logging.info('Cluster: this task is %s. Waiting %s for every peer to '
                 'start.', cluster.describe(),
                 f'up to {timeout:g} s' if timeout else 'without a limit')
    started = time.monotonic()
    if not rendezvous.wait_for_peers(cluster, timeout,
                                      lambda: sigterm.received):
      raise _preempted_at_start_up()
    logging.info('Every peer has started (after %.1f s): joining the cluster.',
                 time.monotonic() - started)
    resolver = _training_resolver(cluster)
    register_seconds = coordination.configure(
        resolver.cluster_spec(), config, started)
    try:
      strategy = tf.distribute.MultiWorkerMirroredStrategy(
          cluster_resolver=resolver,
          communication_options=_communication_options(config))
    except tf.errors.OpError as error:
      raise coordination.not_registered(cluster, timeout, register_seconds,
                                        error) from error
    # A SIGTERM that came during the (C++) constructor before TensorFlow
    # installed its own handler in there has been recorded by now. One that
    # came after is lost to TensorFlow's flag, which ctl does not read: the
    # constructor lasts about half a second once the peers are there (2
    # workers on localhost), which leaves that window small.
    if sigterm.received:
      raise _preempted_at_start_up()
  return strategy, Role(task_type=cluster.task_type,
                        task_id=cluster.task_index,
                        num_workers=len(cluster.training_tasks),
                        is_chief=cluster.is_chief, peers=cluster.peers,
                        has_evaluator=cluster.has_evaluator)


def _training_resolver(
    cluster: cluster_lib.Cluster
) -> tf.distribute.cluster_resolver.ClusterResolver:
  """The cluster as TensorFlow takes it: the training tasks only.

  Built from ctl's own reading of the cluster (TF_CONFIG or a scheduler's
  environment), so an evaluator is left out, and the GPUs are the ones this
  process sees (CUDA_VISIBLE_DEVICES as the scheduler set it).
  """
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster.training_jobs),
      task_type=cluster.task_type, task_id=cluster.task_index,
      rpc_layer='grpc',
      num_accelerators={'GPU': len(tf.config.list_physical_devices('GPU'))})


def _preempted_at_start_up() -> errors.Preempted:
  """The error that ends a start-up stopped by SIGTERM (exit code 42)."""
  return errors.Preempted(
      'SIGTERM while this task waited for the cluster to form: it stopped '
      'before training, so nothing was trained or written. Restart all '
      'workers to run the job.')


class _StartUpSignal:
  """A context in which SIGTERM is recorded instead of killing.

  On leaving, SIGTERM's previous Python handler (normally the default: the
  process ends) comes back, replacing TensorFlow's, which only sets a flag
  nothing reads before training installs its own (tf_process.StopSignal):
  a SIGTERM in between ends the process (code -15) before anything was
  trained, rather than being lost.

  Off the main thread Python cannot install handlers: SIGTERM is then left
  as it is and only the start-up timeout bounds the wait.
  """

  def __init__(self):
    self.received = False
    self._installed = False
    self._previous = signal.SIG_DFL

  def __enter__(self) -> '_StartUpSignal':
    if threading.current_thread() is threading.main_thread():
      previous = signal.signal(signal.SIGTERM, self._handle)
      # None: the handler was not installed from Python; the default then.
      self._previous = signal.SIG_DFL if previous is None else previous
      self._installed = True
    return self

  def __exit__(self, *exc_info) -> None:
    if self._installed:
      signal.signal(signal.SIGTERM, self._previous)

  def _handle(self, signum, frame) -> None:
    del signum, frame
    # Only a flag: the wait reads it between probes and raises from there.
    self.received = True


def leave_together(task: Role, timeout_seconds: float) -> None:
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
  service = tf_cluster_internals.coordination_service()
  timeout_ms = int(1000 * (timeout_seconds or 24 * 3600))
  try:
    service.wait_at_barrier('ctl/exit', timeout_ms)
    if task.is_chief:
      for peer in task.peers:
        service.get_config_key_value(f'ctl/left/{peer}', timeout_ms)
    else:
      service.set_config_key_value(f'ctl/left/{task.name}', 'left')
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


def _choose_kind(strategy: str, has_cluster: bool,
                 has_ps: bool = False) -> str:
  """Resolves 'auto' to a concrete strategy kind."""
  if strategy != 'auto':
    return strategy
  if has_ps:
    return 'parameter_server'
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
  """Without a timeout: ctl/cluster/watchdog.py bounds the waits (a
  collective's own timeout costs a thread for its whole length)."""
  implementation = getattr(tf.distribute.experimental.CommunicationImplementation,
                           config.collective)
  return tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=config.bytes_per_pack,
      implementation=implementation)


def local_replicas(strategy: tf.distribute.Strategy) -> int:
  """The replicas of this worker (the default strategy has one)."""
  try:
    return len(strategy.extended.worker_devices)
  except RuntimeError:  # The default strategy has no worker devices.
    return 1
