"""train_and_evaluate: builds a task and everything around it, then trains.

Read top to bottom: the strategy, the task and its data, the checkpoint
(restored before anything is written), the step runner, the periodic
actions, the loop, the results.
"""

from collections.abc import Callable
import errno
import os

from absl import logging
import keras
import ml_collections
import numpy as np
import tensorflow as tf

from ctl import config as config_lib
from ctl import errors
from ctl import task as task_lib
from ctl import tasks
from ctl.data import inputs
from ctl.data import tfrecord
from ctl.runtime import checkpointing
from ctl.runtime import distribution
from ctl.runtime import periodic
from ctl.runtime import preemption
from ctl.runtime import summaries
from ctl.runtime import tf_internals
from ctl.runtime import workdir as workdir_lib
from ctl.training import assemble as assemble_lib
from ctl.training import best as best_lib
from ctl.training import evaluate as evaluate_lib
from ctl.training import evaluation
from ctl.training import loop as loop_lib
from ctl.training import metric_reading
from ctl.training import speed as speed_lib
from ctl.training import state as state_lib
from ctl.training import steps as steps_lib
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
      results = _run(config, workdir, strategy, task_info, task_class,
                     stop_signal, workdir_lock, started)
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


def _run(config, workdir, strategy, task_info, task_class, stop_signal,
         workdir_lock, started) -> dict:
  """train_and_evaluate, once the strategy exists."""
  assembled = assemble_lib.assemble(config, strategy, task_info, task_class)
  task, state, length = assembled.task, assembled.state, assembled.length
  train_data = assembled.train_data
  in_memory = isinstance(train_data, task_lib.InMemory)
  jit_compile = xla.resolve(config.jit_compile,
                            num_replicas=strategy.num_replicas_in_sync,
                            task=task, in_memory=in_memory)
  logging.info('XLA compiles: %s (config.jit_compile=%r)', jit_compile,
               config.jit_compile)
  train_input = _train_input(config, strategy, train_data, length,
                             jit_compile)
  data_positions = checkpointing.DataPositions(
      train_input.checkpointable, workdir_lib.data_position_dir(workdir),
      max_to_keep=config.intervals.keep_checkpoints,
      pipeline=task_info.worker_index, num_pipelines=task_info.num_workers)
  checkpointer = checkpointing.Checkpointer(
      state_lib.checkpoint_of(task, state), workdir_lib.checkpoint_dir(workdir),
      is_chief=task_info.is_chief, task_id=task_info.task_id,
      max_to_keep=config.intervals.keep_checkpoints,
      async_save=config.intervals.async_checkpoint,
      data_problem=data_positions.problem)

  data_positions.check_savable(train_input.dataset)
  # Nothing is written before the run is known to start: a checkpoint that
  # does not fit, or a finished run, leaves the workdir as it was.
  if checkpointer.restore_latest():
    state.check_resumable(length.steps_per_epoch)
    data_positions.restore(int(state.step.numpy()))
  elif config.init_from:
    checkpointing.warm_start(state_lib.models_by_name(task), config.init_from)
  if task_info.num_workers > 1:
    state_lib.check_workers_agree(strategy, state)
  step = int(state.step.numpy())
  results = workdir_lib.read_results(workdir)
  if step >= length.total_steps and results is not None:
    logging.info('Training already finished at step %d of %d: nothing to do. '
                 'Results: %s', step, length.total_steps,
                 workdir_lib.results_path(workdir))
    return {**results, 'finished_now': False}
  if task_info.is_chief:
    workdir_lib.prepare(workdir)
    workdir_lock.acquire()  # A workdir that did not exist before.
    workdir_lib.remove_leftovers(workdir)
    workdir_lib.save_config(workdir, config)

  evaluator = evaluation.Evaluator(
      strategy=strategy, task=task, context=assembled.context,
      eval_batch_size=length.eval_batch_size, seed=config.seed,
      make_writer=lambda name: summaries.make_writer(
          os.path.join(workdir_lib.summary_dir(workdir, 'eval'), name),
          task_info.is_chief))
  evaluate = _InLoopEvaluation(
      evaluator, checkpointer, task_info,
      best_lib.BestCheckpoint(workdir, config.evaluation.best_metric,
                              config.evaluation.best_mode,
                              is_chief=task_info.is_chief,
                              reread=task_info.num_workers == 1))
  train_writer = summaries.make_writer(
      workdir_lib.summary_dir(workdir, 'train'), task_info.is_chief)
  try:
    timing = {}
    if step < length.total_steps:
      timing = _train(
          config, workdir, strategy, task, task_info, state, length,
          train_input, checkpointer, data_positions, evaluate, train_writer,
          stop_signal, started, jit_compile)
    if evaluate.last is None:
      evaluate(int(state.step.numpy()))
    eval_results = evaluate.last
  finally:
    # Whatever happened, what was written so far is whole on disk.
    train_writer.close()
    evaluator.close()
    checkpointer.wait()
    evaluate.finish()

  results = {
      **state.as_dict(),
      'eval': eval_results or {},
      'weights_sha256': state_lib.weights_fingerprint(task),
      # Of this process only: a resumed run's earlier processes are not in it.
      'timing': timing,
  }
  # Every worker logs the fingerprint so that a multi-worker job can be
  # checked for replicas that drifted apart.
  logging.info('Final weights sha256 %s (task %s)', results['weights_sha256'],
               task_info.name)
  if task_info.is_chief:
    workdir_lib.write_json(workdir_lib.results_path(workdir),
                           summaries.json_ready(results))
    logging.info('Results written to %s', workdir_lib.results_path(workdir))
  return {**results, 'finished_now': True}


class _InLoopEvaluation:
  """Evaluates in the loop and keeps the best checkpoint; does nothing when
  the cluster has an evaluator task, which then does both."""

  def __init__(self, evaluator: evaluation.Evaluator,
               checkpointer: checkpointing.Checkpointer,
               task_info: distribution.Task,
               best: best_lib.BestCheckpoint):
    self._evaluator = evaluator
    self._checkpointer = checkpointer
    self._best = best
    self._enabled = not task_info.has_evaluator
    if task_info.has_evaluator:
      logging.info('The cluster\'s evaluator task evaluates the checkpoints: '
                   'training does not evaluate.')
    self.last = None  # The latest results.

  def __call__(self, step: int) -> None:
    if not self._enabled or not self._evaluator.has_data():
      return
    self.last = self._evaluator.evaluate(step)
    # Every worker has the same (all-reduced) results, so all decide alike
    # and take part in the save.
    if self._best.improves(self.last):
      self._best.keep(step, self.last, self._checkpointer.write_copy,
                      wait=self._checkpointer.wait)

  def finish(self) -> None:
    """Records a best checkpoint still being written, once it is."""
    self._best.finish()


def _train(config, workdir, strategy, task, task_info, state, length,
           train_input, checkpointer, data_positions, evaluate, train_writer,
           stop_signal, started, jit_compile):
  """The step runner, the periodic actions and the loop; runs it.

  Returns:
    The speed and start-up timing of this process.
  """
  runner = steps_lib.StepRunner(
      strategy=strategy, task=task, train_input=train_input, state=state,
      global_batch_size=length.global_batch_size, seed=config.seed,
      steps_per_epoch=length.steps_per_epoch, jit_compile=jit_compile,
      all_reduce_dtype=config.distribution.all_reduce_dtype,
      summary_steps=config.intervals.summary_steps)
  intervals = config.intervals
  speed = speed_lib.SpeedMeter()
  summary_every = periodic.Every((intervals.summary_steps,),
                                 at_epoch_end=True)
  reporter = loop_lib.Reporter(
      length=length, metrics=metric_reading.MetricReader(task.train_metrics),
      writer=train_writer, speed=speed, summary_every=summary_every)
  timing = {'first_step_seconds': None}

  def save(step):
    data_positions.save(step)
    checkpointer.save(step)

  def first_step_done():
    timing['first_step_seconds'] = speed_lib.seconds_since(started)
    logging.info('First step done %.1f s after the process started',
                 timing['first_step_seconds'])

  actions = [
      loop_lib.Action('report', periodic.Every(
          (intervals.log_steps, intervals.summary_steps), at_epoch_end=True),
                      reporter.report),
      loop_lib.Action('evaluate', periodic.Every(
          (intervals.eval_steps,), at_epoch_end=True), evaluate),
      *_profile_actions(config.profile, workdir, task_info.is_chief),
  ]
  checkpoint = loop_lib.Action('checkpoint', periodic.Every(
      (intervals.checkpoint_steps,
       length.steps_per_epoch * intervals.checkpoint_epochs)), save)
  train_loop = loop_lib.TrainLoop(
      runner=runner, length=length, steps_per_loop=config.steps_per_loop,
      actions=actions, checkpoint=checkpoint,
      checkpoint_clock=periodic.Periodic(every_secs=intervals.checkpoint_secs),
      stop_signal=stop_signal, speed=speed, on_logs=reporter.add,
      on_first_step=first_step_done)
  loops = train_loop.plan(int(state.step.numpy()))
  step_writer = summaries.step_summary_writer(
      workdir_lib.summary_dir(workdir, 'train'), task_info.is_chief)
  try:
    with step_writer.as_default():
      train_loop.run(train_input.make_iterator(loops), loops)
  finally:
    step_writer.close()
  timing['steps_per_second'] = speed.steady_steps_per_second()
  return timing


def _train_input(config, strategy, train_data, length, jit_compile):
  """The step loop's view of the training data."""
  if isinstance(train_data, task_lib.InMemory):
    return inputs.InMemoryInput(
        strategy, train_data, seed=config.seed,
        global_batch_size=length.global_batch_size,
        steps_per_epoch=length.steps_per_epoch,
        pad_loops_to=config.steps_per_loop if jit_compile == 'loop' else None)
  return inputs.DatasetInput(strategy, train_data,
                             distribution.local_replicas(strategy))


def _profile_actions(config, workdir: str, is_chief: bool):
  """Start and stop a profiler trace around config.num_steps steps."""
  if not config.num_steps or not is_chief:
    return []
  logdir = workdir_lib.summary_dir(workdir, 'train')
  # The first step traces the functions: a trace starts after it at least.
  start = max(config.start_step, 1)
  end = start + config.num_steps

  def begin(step):
    if step == start:
      tf.profiler.experimental.start(logdir)

  def finish(step):
    if step == end:
      tf.profiler.experimental.stop()
      logging.info('Profiled steps %d..%d into %s', start + 1, end, logdir)

  # Loops end at these steps; the trace covers the steps in between.
  return [loop_lib.Action('profile start', periodic.Every((start,)), begin),
          loop_lib.Action('profile stop', periodic.Every((end,)), finish)]
