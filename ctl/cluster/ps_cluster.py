"""Parameter-server jobs (distribution.strategy='parameter_server').

The chief is the coordinator: `build_coordinator` waits (bounded, SIGTERM
stops it) until every worker and server listens, then builds
tf.distribute.experimental.ParameterServerStrategy and its
tf.distribute.coordinator.ClusterCoordinator, which schedules the steps
(ctl/training/parameter_servers.py). The tasks of type 'worker' and 'ps'
only run TensorFlow's server (`serve`): the coordinator runs their work
on them. They serve until the chief writes the job's end in the workdir
(`mark_job_done`), or until SIGTERM.
"""

import os
import signal
import socket
import threading
import time

from absl import logging
import ml_collections
import tensorflow as tf

from ctl import errors
from ctl import storage
from ctl.cluster import tf_config as cluster_lib
from ctl.runtime import workdir as workdir_lib

# The tasks that only serve: the coordinator runs steps on the workers and
# keeps the variables on the servers ('ps').
SERVER_JOBS = ('worker', 'ps')
PS_JOBS = ('chief', 'worker', 'ps')
# How often a serving task looks for the job's end, and the chief for a
# task that does not listen yet.
_POLL_SECONDS = 0.5
# How long a serving task waits, once the chief marked the job done, for
# the chief's process to end: the coordinator still talks to the workers
# and servers as it exits (it removes its functions from them).
_LEAVE_AFTER_SECONDS = 60.0
# What a serving task's TensorFlow server runs its ops with: one inter-op
# thread hung an in-process cluster (TF_NOTES.md).
_INTER_OP_THREADS = 4


def has_ps(cluster: cluster_lib.Cluster | None, strategy: str) -> bool:
  """Whether the cluster has parameter servers.

  Raises:
    ConfigError: it has, and strategy is neither 'auto' nor
      'parameter_server'.
  """
  if cluster is None or 'ps' not in cluster.jobs:
    return False
  if strategy not in ('auto', 'parameter_server'):
    raise errors.ConfigError(
        f'{cluster.source} names "ps" tasks (parameter servers), but '
        f'distribution.strategy={strategy!r}: set it to '
        "'parameter_server' or 'auto', or remove the \"ps\" job.")
  return True


def build(config: ml_collections.ConfigDict,
          cluster: cluster_lib.Cluster | None
          ) -> tf.distribute.experimental.ParameterServerStrategy | None:
  """The chief's strategy (`build_coordinator`); None for a worker or
  server, which only serves (`serve`).

  Raises:
    ConfigError: no cluster, or one parameter servers cannot run.
  """
  if cluster is None:
    raise errors.ConfigError(
        "distribution.strategy='parameter_server' needs a cluster with "
        '"chief", "worker" and "ps" tasks, but '
        f'{config.cluster_resolver!r} found none: set TF_CONFIG, or start '
        'the job with ctl.launch --num_workers=N --num_ps=K.')
  check_cluster(cluster)
  if is_server(cluster.task_type):
    return None
  return build_coordinator(config, cluster)


def check_cluster(cluster: cluster_lib.Cluster) -> None:
  """Raises ConfigError unless the cluster can run parameter-server
  training: one chief (the coordinator), workers and servers; an
  evaluator task, if any, evaluates the chief's checkpoints beside them."""
  missing = [job for job in PS_JOBS if job not in cluster.jobs]
  if missing:
    raise errors.ConfigError(
        f"distribution.strategy='parameter_server' needs the jobs "
        f'"chief" (the coordinator), "worker" and "ps" in {cluster.source}; '
        f'it has no {" or ".join(json_name(job) for job in missing)}. '
        'ctl.launch --num_workers=N --num_ps=K starts such a job.')


def json_name(job: str) -> str:
  """A job's name quoted as in TF_CONFIG."""
  return f'"{job}"'


def is_server(task_type: str | None) -> bool:
  """Whether a task of this type only serves (a worker or a ps task)."""
  return task_type in SERVER_JOBS


def build_coordinator(
    config: ml_collections.ConfigDict, cluster: cluster_lib.Cluster
) -> tf.distribute.experimental.ParameterServerStrategy:
  """The chief's strategy, once every other task listens; its
  ClusterCoordinator is made with it (one per strategy).

  Raises:
    PeerFailure: a task did not listen within
      config.startup_timeout_seconds.
    Preempted: SIGTERM came while the chief waited.
  """
  _wait_until_listening(cluster, config.startup_timeout_seconds)
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({job: list(cluster.jobs[job]) for job in PS_JOBS}),
      task_type=cluster.task_type, task_id=cluster.task_index,
      rpc_layer='grpc')
  num_servers = len(cluster.jobs['ps'])
  strategy = tf.distribute.experimental.ParameterServerStrategy(
      resolver, variable_partitioner=partitioner(config, num_servers))
  tf.distribute.coordinator.ClusterCoordinator(strategy)
  logging.info('Coordinating %d worker(s) and %d parameter server(s).',
               len(cluster.jobs['worker']), num_servers)
  return strategy


def partitioner(
    config: ml_collections.ConfigDict, num_servers: int
) -> tf.distribute.experimental.partitioners.Partitioner | None:
  """What shards variables over the servers: TensorFlow's
  MinSizePartitioner (a variable of more than config.min_shard_bytes bytes
  is split by rows into shards of about that size, at most one a server);
  None with min_shard_bytes 0, or one server, where nothing is split.

  Args:
    config: the `distribution` section (a config of an earlier release
      may lack min_shard_bytes: none).
    num_servers: the job's parameter servers.
  """
  min_shard_bytes = config.get('min_shard_bytes') or 0
  if not min_shard_bytes or num_servers < 2:
    return None
  return tf.distribute.experimental.partitioners.MinSizePartitioner(
      min_shard_bytes=min_shard_bytes, max_shards=num_servers)


def lost_server_failure(
    cluster: cluster_lib.Cluster | None) -> errors.PeerFailure | None:
  """What an error means while a parameter server of the job (the
  cluster's "ps" tasks, from TF_CONFIG or Slurm's variables) no longer
  listens at its address: exit 43, naming it; None in any other job, or
  while every server listens. Whatever the error: a lost server fails a
  loop of steps, a save or an evaluation (each reads the servers'
  variables), mostly with an UnavailableError."""
  lost = [f'ps:{index}' for index, address in
          enumerate(cluster.jobs.get('ps', ()) if cluster else ())
          if not listens(address)]
  if not lost:
    return None
  return errors.PeerFailure(
      f'The parameter server(s) {", ".join(lost)} stopped answering: the '
      'variables they held since the last checkpoint are lost. Start the '
      'job again (every task): it resumes from the latest checkpoint.')


def _wait_until_listening(cluster: cluster_lib.Cluster,
                          timeout_seconds: float) -> None:
  """Returns once every other task accepts connections at its address."""
  waiting = [f'{job}:{index}' for job in PS_JOBS
             for index in range(len(cluster.jobs[job]))
             if (job, index) != (cluster.task_type, cluster.task_index)]
  started = time.monotonic()
  with _Stop() as stop:
    while waiting:
      waiting = [task for task in waiting
                 if not listens(cluster.address_of(task))]
      if not waiting:
        break
      if stop.event.is_set():
        raise errors.Preempted(
            'SIGTERM while the chief waited for the workers and servers to '
            'start: nothing was trained or written.')
      if timeout_seconds and time.monotonic() - started > timeout_seconds:
        raise errors.PeerFailure(
            f'{", ".join(waiting)} did not start within {timeout_seconds:g} '
            's (distribution.startup_timeout_seconds): nothing listens at '
            f'{", ".join(cluster.address_of(task) for task in waiting)}. '
            'Start them, then the chief again.')
      stop.event.wait(_POLL_SECONDS)


def listens(address: str) -> bool:
  """Whether something accepts a TCP connection at "host:port"."""
  host, _, port = address.rpartition(':')
  try:
    with socket.create_connection((host.strip('[]'), int(port)), timeout=2):
      return True
  except OSError:
    return False


def serve(config: ml_collections.ConfigDict, workdir: str,
          cluster: cluster_lib.Cluster) -> dict:
  """A worker's or server's life: TensorFlow's server, until the chief
  marks the job done and has exited (returns), SIGTERM (raises Preempted:
  exit 42), or until the chief has not listened for too long
  (`_check_chief`; raises PeerFailure: exit 43): a chief that failed or
  was killed marks nothing, and under Slurm no one else ends the step's
  other tasks.

  Args:
    config: the `distribution` section.
    workdir: where the chief marks the job's end.
    cluster: the job, and which task of it this is.
  """
  before = storage.read_text(workdir_lib.job_done_path(workdir))
  # SIGTERM is caught from before the server starts, so that once the log
  # says it serves, a SIGTERM always ends in the message below (exit 42).
  with _Stop() as stop:
    server = tf.distribute.Server(
        tf.train.ClusterSpec({job: list(cluster.jobs[job])
                              for job in PS_JOBS}),
        job_name=cluster.task_type, task_index=cluster.task_index,
        protocol='grpc',
        config=tf.compat.v1.ConfigProto(
            inter_op_parallelism_threads=_INTER_OP_THREADS), start=True)
    logging.info('Serving as %s at %s until the chief marks the job done '
                 '(%s) or SIGTERM.', cluster.task_name, cluster.address,
                 workdir_lib.job_done_path(workdir))
    done_since = chief_seen = None
    started = time.monotonic()
    while not stop.event.wait(_POLL_SECONDS):
      chief_listens = listens(cluster.address_of('chief:0'))
      now = time.monotonic()
      chief_seen = now if chief_listens else chief_seen
      if done_since is None:
        done = storage.read_text(workdir_lib.job_done_path(workdir))
        done_since = now if done and done != before else None
        if done_since is None:
          _check_chief(config, cluster, now - (chief_seen or started),
                       seen=chief_seen is not None)
      elif not chief_listens or now - done_since > _LEAVE_AFTER_SECONDS:
        logging.info('The chief marked the job done: %s leaves (its server '
                     'served at %s).', cluster.task_name, server.target)
        return {'served': cluster.task_name}
  raise errors.Preempted(f'SIGTERM: {cluster.task_name} left the job; '
                         + _WHAT_FOLLOWS[cluster.task_type])


# What a serving task's leaving means for the job: a worker's steps go to
# the others; a server's variables are gone with it.
_WHAT_FOLLOWS = {
    'worker': 'the coordinator runs its steps on the other workers. Start '
              'it again to rejoin.',
    'ps': 'a chief still training stops with exit 43 naming it (its '
          'variables lived here). Start the job again: it resumes from the '
          'latest checkpoint.',
}


def _check_chief(config: ml_collections.ConfigDict,
                 cluster: cluster_lib.Cluster, silent_seconds: float,
                 seen: bool) -> None:
  """Raises PeerFailure (exit 43) once the chief has not listened for too
  long: config.timeout_seconds since it last did, or, before it first
  did, config.startup_timeout_seconds (as long as it waits for this task:
  it listens once every task does, build_coordinator); 0 waits forever."""
  field = 'timeout_seconds' if seen else 'startup_timeout_seconds'
  limit = config[field]
  if limit and silent_seconds > limit:
    raise errors.PeerFailure(
        f'The chief (chief:0 at {cluster.address_of("chief:0")}) has not '
        f'answered for {limit:g} s (distribution.{field}) and did not mark '
        f'the job done: {cluster.task_name} leaves. Start the job again '
        '(every task): it resumes from the latest checkpoint.')


def mark_job_done(workdir: str) -> None:
  """The chief's word to the serving tasks that the job is over."""
  storage.write_text(workdir_lib.job_done_path(workdir),
                     f'{time.time_ns()} {os.getpid()}\n')


class _Stop:
  """A context in which SIGTERM sets an event instead of killing (on the
  main thread; elsewhere SIGTERM is left as it is)."""

  def __init__(self):
    self.event = threading.Event()
    self._previous = None

  def __enter__(self) -> '_Stop':
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM,
                                     lambda *_: self.event.set())
    return self

  def __exit__(self, *exc_info) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
    elif threading.current_thread() is threading.main_thread():
      # None: a handler not installed from Python; the default then.
      signal.signal(signal.SIGTERM, signal.SIG_DFL)
