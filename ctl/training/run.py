"""train_and_evaluate: builds a task and everything around it, then trains.

The strategy, then the Trainer (ctl/training/trainer.py) runs the task;
what its failures mean for the user is said here.
"""

from collections.abc import Callable
import errno
import os

from absl import logging
import ml_collections
import tensorflow as tf

from ctl import config as config_lib
from ctl import errors
from ctl import tasks
from ctl.data import tfrecord
from ctl.runtime import checkpointing
from ctl.runtime import distribution
from ctl.runtime import preemption
from ctl.runtime import tf_internals
from ctl.runtime import workdir as workdir_lib
from ctl.training import evaluate as evaluate_lib
from ctl.training import speed as speed_lib
from ctl.training import trainer as trainer_lib
from ctl.training import xla

# What a collective raises when a peer is gone or too slow.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                tf.errors.AbortedError, tf.errors.CancelledError)


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str,
    on_finish: Callable[[distribution.Task, bool], None] | None = None
) -> dict:
  """Trains and evaluates config's task, resuming from workdir's checkpoint.

  The evaluator task of a cluster evaluates the chief's checkpoints instead
  (ctl/training/evaluate.py).

  Args:
    config: the whole config (see ctl/config.py).
    workdir: where checkpoints, summaries and results go (chief only).
    on_finish: called on every training task with its place in the job
      and whether training has just finished (False: it had finished
      before), before the workers leave together; or on the evaluator once
      it evaluated the final checkpoint.

  Returns:
    The results: final step, epoch and evaluation metrics, as saved in
    workdir/results.json.

  Raises:
    ConfigError: the config cannot work; nothing was written.
    Preempted: SIGTERM stopped training after a checkpoint at that step.
    PeerFailure: another worker died or hung; nothing half-done was saved.
    CtlError: the data, the workdir, the task or a checkpoint is unusable,
      or the loss diverged; no checkpoint or result was overwritten.
  """
  started = speed_lib.process_start_time()
  config_lib.validate(config)
  task_class = tasks.resolve(config.task)
  tf_internals.apply_fixes()
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  strategy, task_info = distribution.build_strategy(config.distribution)
  if task_info.task_type == 'evaluator':
    results = evaluate_lib.evaluate_continuously(config, workdir, strategy)
    if on_finish and results.get('finished'):
      on_finish(task_info, True)
    return results
  logging.info('Task %s of %d worker(s), %d replica(s) in sync, chief: %s',
               task_info.name, task_info.num_workers,
               strategy.num_replicas_in_sync, task_info.is_chief)
  timeout_seconds = config.distribution.timeout_seconds
  with preemption.StopSignal() as stop_signal, workdir_lib.Lock(
      workdir, enabled=task_info.is_chief) as workdir_lock:
    try:
      results = trainer_lib.Trainer(
          config, workdir, strategy=strategy, task_info=task_info,
          task_class=task_class, stop_signal=stop_signal,
          workdir_lock=workdir_lock, started=started).run()
      finished_now = results.pop('finished_now')
      if on_finish:
        on_finish(task_info, finished_now)
    except errors.Preempted:
      distribution.leave_together(task_info, timeout_seconds)
      raise
    except _PEER_ERRORS as error:
      if task_info.num_workers == 1:
        raise
      raise errors.PeerFailure(
          f'Lost the other workers ({type(error).__name__}): a worker died, '
          'was stopped, or did not respond within '
          f'distribution.timeout_seconds={timeout_seconds}. Nothing was saved '
          'after the latest checkpoint in '
          f'{workdir_lib.checkpoint_dir(workdir)}; restart every worker to '
          'resume from it.') from error
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
      data_error = tfrecord.data_error(error)
      if data_error is not None:
        raise data_error from error
      reason = xla.failure(error)
      if reason is None:
        raise
      raise errors.CtlError(
          f'XLA cannot compile the training step: {reason}. Run with '
          f'--config.jit_compile=off (config.jit_compile='
          f'{config.jit_compile!r}). Nothing was trained.') from error
    except (tf.errors.OpError, OSError) as error:
      storage_error = _storage_failure(error, workdir)
      if storage_error is None:
        raise
      raise storage_error from error
  distribution.leave_together(task_info, timeout_seconds)
  return results


def _storage_failure(error: Exception, workdir: str) -> errors.CtlError | None:
  """The error for a full disk or a workdir that vanished mid-run; None for
  other errors. Checkpoints are whole or absent (the state file naming the
  latest is written last), so the latest whole one is kept either way."""
  message = str(error)
  if not os.path.isdir(workdir):
    return errors.CtlError(
        f'The workdir {workdir} vanished during the run (deleted, moved or '
        f'unmounted): {checkpointing.summary(error, 300)}. Restore it (the '
        'latest whole checkpoint in it resumes the run) or train in a new '
        '--workdir.')
  if 'No space left on device' in message or getattr(
      error, 'errno', None) == errno.ENOSPC:
    return errors.CtlError(
        f'The disk of {workdir} is full: {checkpointing.summary(error, 300)}. '
        'Every checkpoint before the one being written is whole and kept. '
        'Free some space (or lower config.intervals.keep_checkpoints), then '
        'run the same command again to resume from the latest.')
  return None
