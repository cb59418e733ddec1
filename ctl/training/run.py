"""train_and_evaluate: builds a task and everything around it, then trains.

The strategy, then the Trainer (ctl/training/trainer.py) runs the task;
what its failures mean for the user is said by failures.py.
"""

from collections.abc import Callable
import contextlib
import functools
import signal

from absl import logging
import ml_collections
import tensorflow as tf

from ctl import config as config_lib
from ctl import errors
from ctl import task_hooks
from ctl.cluster import diagnostics
from ctl.cluster import distribution
from ctl.cluster import input_wait
from ctl.cluster import peer_evidence
from ctl.cluster import ps_cluster
from ctl.cluster import watchdog as watchdog_lib
from ctl.cluster import worker_status
from ctl.cluster import worker_timings
from ctl.runtime import tf_internals
from ctl.runtime import tf_process
from ctl.runtime import workdir as workdir_lib
from ctl.training import checkpoint_evaluation
from ctl.training import failures
from ctl.training import job as job_lib
from ctl.training import sharding
from ctl.training import trainer as trainer_lib


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str,
    on_finish: Callable[[distribution.Role, bool, dict], None] | None = None,
    start_up: tf_process.StartUp | None = None) -> dict:
  """Trains and evaluates config's task, resuming from workdir's checkpoint.

  The evaluator task of a cluster evaluates the chief's checkpoints instead
  (ctl/training/checkpoint_evaluation.py).

  Args:
    config: the whole config (see ctl/config.py).
    workdir: where checkpoints, summaries and results go (chief only).
    on_finish: called on every training task with its place in the job
      and whether training has just finished (False: it had finished
      before) and the results, before the workers leave together; or on
      the evaluator once it evaluated the final checkpoint.
    start_up: its start-up so far (default: from the process's start).

  Returns:
    The results: final step, epoch and eval metrics (workdir/results.json).

  Raises:
    ConfigError: the config cannot work; nothing was written.
    Preempted: SIGTERM stopped training after a checkpoint at that step.
    PeerFailure: another worker died or hung; nothing half-done was saved.
    CtlError: the data, the workdir, the task or a checkpoint is unusable,
      or the loss diverged; no checkpoint or result was overwritten.
  """
  start_up = start_up or tf_process.process_start_up()
  task_class, strategy, role = _set_up(config)
  if strategy is None or role.task_type == 'evaluator':
    return _serve_or_evaluate(config, workdir, strategy, role, on_finish)
  _log_place_in_cluster(role, strategy)
  watchdog, status, dumps = _watchdog_and_status(config, workdir, role,
                                                 _ps_job(config, strategy))
  trainer = None
  with tf_process.StopSignal() as stop_signal, workdir_lib.Lock(
      workdir, enabled=role.is_chief) as workdir_lock, (
          status.recording()), _dump_on_signal(status):
    try:
      with watchdog or contextlib.nullcontext():
        trainer = trainer_lib.Trainer(
            config, workdir, task_class=task_class,
            job=job_lib.Job(strategy, role, watchdog, status),
            process=job_lib.Process(stop_signal, workdir_lock, start_up))
        results, finished_now = trainer.run()
      if distribution.is_parameter_server(strategy):
        ps_cluster.mark_job_done(workdir)  # Its workers and servers leave.
      if on_finish:
        on_finish(role, finished_now, results)
    except errors.Preempted:
      distribution.leave_together(role, config.distribution.timeout_seconds)
      raise
    except Exception as error:  # pylint: disable=broad-except
      _raise_what_it_means(error, config, workdir, trainer and trainer.task,
                           role, workdir_lock, status, dumps)
      raise
    _record_end(status, results)
  distribution.leave_together(role, config.distribution.timeout_seconds)
  return results


def _dump_on_signal(
    status: worker_status.WorkerStatus) -> tf_process.OnSignal:
  """SIGUSR1 writes this worker's diagnostics dump, training going on."""
  return tf_process.OnSignal(
      signal.SIGUSR1, functools.partial(diagnostics.write_on_signal, status),
      name='ctl-diagnostics-on-signal')


def _set_up(
    config: ml_collections.ConfigDict
) -> tuple[type, tf.distribute.Strategy | None, distribution.Role]:
  """Checks the config, sets TensorFlow up for it and builds the strategy.

  Returns:
    The task's class, the strategy (None for a parameter-server job's
    worker or server, which only serves) and this task's place in the
    cluster.

  Raises:
    ConfigError: the config cannot work; nothing was written.
  """
  config_lib.validate(config)
  task_class = task_hooks.resolve(config.task)
  tf_internals.apply_fixes()
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  strategy, role = distribution.build_strategy(config.distribution)
  if config.distribution.get('min_shard_bytes'):
    sharding.check_strategy(config.distribution, strategy, role)
  return task_class, strategy, role


def _log_place_in_cluster(role: distribution.Role,
                          strategy: tf.distribute.Strategy) -> None:
  """Logs which task this is, of how many, and whether it is the chief."""
  logging.info('Task %s of %d worker(s), %d replica(s) in sync, chief: %s',
               role.name, role.num_workers,
               strategy.num_replicas_in_sync, role.is_chief)


def _ps_job(config: ml_collections.ConfigDict,
            strategy: tf.distribute.Strategy) -> dict[str, int] | None:
  """A parameter-server job's task counts by job (its chief's status file
  says them, for ctl.status); None for another strategy."""
  if not distribution.is_parameter_server(strategy):
    return None
  cluster = distribution.read_cluster(config.distribution)
  return {job: len(cluster.jobs[job]) for job in ps_cluster.PS_JOBS}


def _watchdog_and_status(
    config: ml_collections.ConfigDict, workdir: str,
    role: distribution.Role, ps_job: dict[str, int] | None = None
) -> tuple[watchdog_lib.Watchdog | None, worker_status.WorkerStatus,
           list[str]]:
  """What watches a training task: its watchdog (None for a job of one
  worker, which waits on no peer), its worker status (ps_job: the chief's
  of a parameter-server job, `_ps_job`), and the list where the
  watchdog's diagnostics dump goes when it aborts."""
  timeout_seconds = config.distribution.timeout_seconds
  if role.num_workers == 1:
    # Nothing to bound, compare or time against peers: the status file is
    # written by the training thread itself (ctl/cluster/worker_status.py).
    return None, worker_status.WorkerStatus(
        workdir, timeout_seconds=timeout_seconds, job=ps_job), []
  # Bounds every wait for a peer while the task is built and trained.
  watchdog = watchdog_lib.Watchdog(timeout_seconds)
  status = worker_status.WorkerStatus(
      workdir, worker_index=role.worker_index,
      num_workers=role.num_workers, timeout_seconds=timeout_seconds,
      progress_age=watchdog.seconds_since_progress,
      on_report=worker_timings.from_config(config.get('diagnostics'),
                                           workdir, role.is_chief,
                                           role.num_workers),
      input_wait=input_wait.make(role.num_workers,
                                 config.deterministic))
  dumps = []  # The watchdog's, written while the stuck thread still waits.
  watchdog.on_abort = lambda why: dumps.append(diagnostics.write(
      status, f'{why}: aborting the collectives'))
  watchdog.gone_peer = lambda: peer_evidence.gone_here(status)
  return watchdog, status, dumps


def _raise_what_it_means(error: Exception, config: ml_collections.ConfigDict,
                         workdir: str, task, role: distribution.Role,
                         workdir_lock: workdir_lib.Lock,
                         status: worker_status.WorkerStatus,
                         dumps: list[str]) -> None:
  """Raises, from error, what it means for the user (failures.py), naming
  the stalled peers of a PeerFailure; returns when that is not known.

  A parameter server gone explains any error (ps_cluster), and has no
  peers' status files to read: the chief is a job's one worker there.
  """
  if isinstance(error, errors.CtlError):
    return  # Says what it means already.
  failure = ps_cluster.lost_server_failure(
      distribution.read_cluster(config.distribution))
  if failure is not None:
    raise failure from error
  if not isinstance(error, (tf.errors.OpError, OSError)):
    return
  failure = failures.explain(
      error, workdir=workdir, task=task, role=role,
      timeout_seconds=config.distribution.timeout_seconds,
      jit_compile=config.jit_compile, workdir_lock=workdir_lock)
  if failure is None:
    return
  if isinstance(failure, errors.PeerFailure) and status.started:
    failure = diagnostics.name_stalled_peers(
        failure, status, error, dumps[0] if dumps else None)
  raise failure from error


def _record_end(status: worker_status.WorkerStatus, results: dict) -> None:
  """Records in the worker's status that training finished, or stopped
  early (an action's reason)."""
  stopped = results.get('stopped')
  status.finish(worker_status.STOPPED if stopped else
                worker_status.FINISHED,
                stopped and stopped['reason'], 0)


def _serve_or_evaluate(config, workdir, strategy, role, on_finish) -> dict:
  """A task that does not train: a parameter-server job's worker or server
  serves (strategy None); the cluster's evaluator task evaluates each
  checkpoint of the chief."""
  if strategy is None:
    return distribution.serve_parameter_server_task(config.distribution,
                                                    workdir)
  results = checkpoint_evaluation.evaluate_continuously(config, workdir,
                                                        strategy)
  if on_finish and results.get('finished'):
    on_finish(role, True, results)
  return results
