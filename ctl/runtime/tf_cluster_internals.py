"""The private TensorFlow APIs of ctl's cluster machinery: the coordination
service of all-reduce jobs, and each worker's input in parameter-server
jobs.

The rest of ctl's private API uses are in tf_internals.py; as there, each
was checked on TensorFlow 2.21 and is covered by
tests/runtime/test_tf_internals.py, which fails when the upstream
behaviour it relies on changes.
"""

from collections.abc import Callable
from typing import Any

import tensorflow as tf


def coordination_service():
  """TensorFlow's coordination service client: barriers and a key-value
  store shared by the workers (tf.distribute's failure handling uses it;
  there is no public API)."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  return context.context()


def configure_coordination_service(cluster_spec: tf.train.ClusterSpec,
                                   heartbeat_timeout_ms: int,
                                   register_timeout_ms: int) -> None:
  """Sets up TensorFlow's coordination service for the next
  MultiWorkerMirroredStrategy, with these timeouts instead of its own.

  The strategy's constructor configures the service itself only when
  nothing has (`collective_all_reduce_strategy.py`, `_initialize_multi_
  worker`), with the same leader and jobs as here, and timeouts of 0,
  which the service reads as its defaults: a task that sends no heartbeat
  for 10 s, or whose heartbeat RPC to the leader takes 5 s, fails the job
  (`coordination_service.cc` kDefaultHeartbeatTimeoutMs,
  `coordination_service_agent.cc` StartSendingHeartbeats), and a task that
  never registers is waited for an hour. Registration waits at a barrier
  (`cluster_register_with_barrier`), so a peer that never registers fails
  the others within register_timeout_ms. With the service configured, the
  strategy also leaves out its Python health check (`_check_health`).
  """
  from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import multi_worker_util  # pylint: disable=g-import-not-at-top
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  jobs = [coordination_config_pb2.CoordinatedJob(
      name=job, num_tasks=cluster_spec.num_tasks(job))
      for job in ('chief', 'worker') if job in cluster_spec.jobs]
  context.context().configure_coordination_service(
      service_type='standalone',
      service_leader=multi_worker_util.coordination_leader(cluster_spec),
      heartbeat_timeout_in_ms=heartbeat_timeout_ms,
      cluster_register_timeout_in_ms=register_timeout_ms,
      coordinated_jobs=jobs)
  # Not an argument of configure_coordination_service.
  context.context().coordination_service.cluster_register_with_barrier = True


def per_worker_iterator(
    coordinator: tf.distribute.coordinator.ClusterCoordinator,
    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset]
) -> Any:
  """An iterator on each worker of the coordinator's cluster over
  `dataset_fn(context)`, with worker i's own context: input pipeline i of
  the cluster's workers.

  `coordinator.create_per_worker_dataset` traces one function and runs it
  on every worker, and the strategy's `distribute_datasets_from_function`
  gives it one InputContext for all, input pipeline 0 of 1
  (parameter_server_strategy_v2.py `_distribute_datasets_from_function`).
  This does for each worker what `PerWorkerDatasetFromDatasetFunction.
  __iter__` does for all (coordinator/values.py): the resource is created
  on worker i alone, from its own function, and a worker that comes back
  gets its own rebuilt (the coordinator re-runs a resource's closure).
  """
  from tensorflow.python.distribute import input_lib  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute.coordinator import values  # pylint: disable=g-import-not-at-top
  strategy = coordinator.strategy
  workers = coordinator._cluster.workers  # pylint: disable=protected-access
  iterators = []
  for index, worker in enumerate(workers):
    context = tf.distribute.InputContext(
        num_input_pipelines=len(workers), input_pipeline_id=index,
        num_replicas_in_sync=strategy.num_replicas_in_sync)
    dataset = values.PerWorkerDatasetFromDatasetFunction(
        lambda context=context: strategy.distribute_datasets_from_function(
            lambda _: dataset_fn(context)), coordinator)
    make = dataset._dataset_fn  # pylint: disable=protected-access
    iterator = worker.create_resource(lambda make=make: iter(make()))
    iterator._type_spec = input_lib.get_iterator_spec_from_dataset(  # pylint: disable=protected-access
        strategy, make.structured_outputs)
    iterators.append(iterator)
  return values.PerWorkerDistributedIterator(tuple(iterators))


def abort_collectives(message: str) -> None:
  """Fails this process's collectives, those waiting and any later one,
  with DeadlineExceededError: what a collective's own timeout does
  (MultiWorkerMirroredStrategy's health check aborts them the same way;
  there is no public API)."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  context.context().abort_collective_ops(tf.errors.DEADLINE_EXCEEDED, message)
