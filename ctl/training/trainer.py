"""The Trainer: one run of a task, read as it happens.

    trainer = Trainer(config, workdir, ...)   # the task built, its input,
                                              # checkpoints, evaluator
    results = trainer.restore_or_start()      # None: there is training to do
    outcome = trainer.train()                 # the loop and its actions
    results = trainer.finish(outcome)         # final evaluation, results.json

Everything periodic (the log line, summaries, evaluation, the best
checkpoint, the profiler, the task's own actions, the checkpoint) is an
action of ctl/actions.py, which the loop (ctl/training/loop.py)
runs between loops of steps (ctl/training/steps.py).
"""

import os

from absl import logging
import ml_collections
import tensorflow as tf

from ctl import actions as actions_lib
from ctl import errors
from ctl import storage
from ctl import task as task_lib
from ctl.checkpoints import best as best_lib
from ctl.checkpoints import contents as checkpoint_contents
from ctl.checkpoints import data_positions
from ctl.checkpoints import manager as checkpoint_manager
from ctl.cluster import distribution
from ctl.cluster import watchdog as watchdog_lib
from ctl.cluster import worker_status
from ctl.data import inputs
from ctl.runtime import preemption
from ctl.runtime import summaries
from ctl.runtime import workdir as workdir_lib
from ctl.training import assemble as assemble_lib
from ctl.training import builtin_actions
from ctl.training import ema
from ctl.training import evaluation
from ctl.training import failures
from ctl.training import loop as loop_lib
from ctl.training import loop_plan
from ctl.training import metric_reading
from ctl.training import mlflow_logger
from ctl.training import pruning
from ctl.training import speed as speed_lib
from ctl.training import state as state_lib
from ctl.training import steps as steps_lib
from ctl.training import xla

When = actions_lib.When


class Trainer:
  """A task built for training, with everything around its loop."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, *,
               strategy: tf.distribute.Strategy, task_info: distribution.Role,
               task_class: type[task_lib.Task],
               stop_signal: preemption.StopSignal, workdir_lock,
               started: float, watchdog: watchdog_lib.Watchdog | None = None,
               status: worker_status.WorkerStatus | None = None):
    """Args as named.

    Args:
      watchdog: bounds each wait for a peer (multi-worker; see
        ctl/cluster/watchdog.py): told of each step, loop, action and
        evaluation batch. None for none.
      status: this worker's status file (ctl/cluster/worker_status.py);
        None for none.
    """
    self.config = config
    self.workdir = workdir
    self.strategy = strategy
    self.task_info = task_info
    self.stop_signal = stop_signal
    self.workdir_lock = workdir_lock
    self.started = started
    self.watchdog = watchdog or watchdog_lib.Watchdog(0)
    self.status = status or worker_status.WorkerStatus(None)
    assembled = assemble_lib.assemble(config, strategy, task_info, task_class,
                                      self.watchdog)
    self.task, self.state = assembled.task, assembled.state
    self.length, self.action_states = assembled.length, assembled.action_states
    self.context = assembled.context
    in_memory = isinstance(assembled.train_data, task_lib.InMemory)
    self.jit_compile = xla.resolve(
        config.jit_compile, num_replicas=strategy.num_replicas_in_sync,
        task=self.task, in_memory=in_memory)
    logging.info('XLA compiles: %s (config.jit_compile=%r)', self.jit_compile,
                 config.jit_compile)
    with self.watchdog.paused():  # Reading data waits on no peer.
      self.train_input = inputs.train_input(
          strategy, assembled.train_data, seed=config.seed,
          length=self.length,
          pad_loops_to=(config.steps_per_loop if self.jit_compile == 'loop'
                        else None),
          num_local_replicas=distribution.local_replicas(strategy),
          context=self.context)
    self.data_positions = data_positions.DataPositions(
        self.train_input.checkpointable,
        workdir_lib.data_position_dir(workdir),
        max_to_keep=config.intervals.keep_checkpoints,
        pipeline=task_info.worker_index, num_pipelines=task_info.num_workers)
    self.checkpointer = checkpoint_manager.Checkpointer(
        assembled.checkpoint(), workdir_lib.checkpoint_dir(workdir),
        is_chief=task_info.is_chief, task_id=task_info.task_id,
        max_to_keep=config.intervals.keep_checkpoints,
        async_save=config.intervals.async_checkpoint,
        data_problem=self.data_positions.problem)
    self.task_actions = [
        *builtin_actions.from_config(config, workdir),
        *mlflow_logger.from_config(config, workdir, task_info.is_chief),
        *pruning.from_config(config, task_info.is_chief),
        *self.task.actions()]
    # The report's state is saved beside theirs, under its own name.
    actions_lib.check_names([*self.task_actions, loop_lib.Reporter])
    if task_info.has_evaluator and any(action.when.after_eval
                                       for action in self.task_actions):
      logging.warning('The cluster\'s evaluator task evaluates, so training '
                      'does not: actions after each evaluation (early '
                      'stopping) never run.')
    self.speed = speed_lib.SpeedMeter()
    self.reporter = None  # The report action, once training starts.
    self.loop = None  # The TrainLoop, once training starts.
    self._stopped = None  # An action's stop, restored from the checkpoint.
    self.best = best_lib.BestCheckpoint(
        workdir, config.evaluation.best_metric, config.evaluation.best_mode,
        is_chief=task_info.is_chief, reread=task_info.num_workers == 1)
    self.evaluation = _Evaluation(self, self.best)

  def _warm_start(self) -> None:
    """Loads config.init_from's model weights; a source whose checkpoint
    state file is not text (TensorFlow raises UnicodeDecodeError reading
    it) fails in one line."""
    source = self.config.init_from
    try:
      checkpoint_contents.warm_start(self.task, source,
                                     self.config.init_select)
    except UnicodeError as error:
      raise errors.CtlError(
          f'Cannot warm-start from config.init_from={source!r}: a checkpoint '
          f'state file there ("checkpoint") is not a text file '
          f'({errors.summary(error, 200)}). Point init_from at a checkpoint '
          'path prefix (.../checkpoints/ckpt-N) or a workdir whose '
          'checkpoints are whole.') from error

  def restore_or_start(self) -> dict | None:
    """Restores the latest checkpoint, or warm-starts, or starts at step 0;
    the results when training had finished before (nothing to do).

    Nothing is written before the run is known to start: a checkpoint that
    does not fit, or a finished run, leaves the workdir as it was.
    """
    self.data_positions.check_savable(self.train_input.dataset)
    if self.checkpointer.restore_latest():
      self.watchdog.beat()
      self.state.check_resumable(self.length.steps_per_epoch)
      self.data_positions.restore(int(self.state.step.numpy()))
      stopped = self.action_states.restore(self.task_actions)
      if stopped:  # An action stopped it here; it was killed before the end.
        self._stopped = loop_lib.Stopped(int(self.state.step.numpy()),
                                         stopped)
    elif self.config.init_from:
      self._warm_start()
    if self.task_info.num_workers > 1:
      state_lib.check_workers_agree(self.strategy, self.state)
    state_lib.note_partitions(self.state, self.train_input.partitions,
                              workdir_lib.checkpoint_dir(self.workdir))
    state_lib.note_workers(self.state, self.task_info.num_workers,
                           self.train_input.kind)
    step = int(self.state.step.numpy())
    results = workdir_lib.read_results(self.workdir)
    # An action's stop is in the checkpoint it saved (self._stopped).
    if results is not None and (step >= self.length.total_steps or
                                self._stopped):
      logging.info('Training already finished at step %d of %d%s: nothing to '
                   'do. Results: %s', step, self.length.total_steps,
                   f' (stopped: {self._stopped.reason})' if self._stopped
                   else '', workdir_lib.results_path(self.workdir))
      return results
    if self.config.accumulate_steps > 1:
      self._check_step_accumulates(step)
    if self.task_info.is_chief:
      workdir_lib.prepare(self.workdir)
      self.workdir_lock.acquire()  # A workdir that did not exist before.
      workdir_lib.remove_leftovers(self.workdir)
      self.checkpointer.remove_leftovers()
      self.best.repair()
      workdir_lib.save_config(self.workdir, self.config)
    return None

  def _check_step_accumulates(self, step: int) -> None:
    """A step that ignores config.accumulate_steps (never calls
    ctx.accumulate) is a config mistake, refused before anything is
    written: traced once more, only for accumulating runs."""
    one_step = loop_plan.LoopPlan(step, step + 1,
                                  self.length.steps_per_epoch, 1)
    self._step_runner(metric_reading.MetricReader([])).trace_step(
        self.train_input.make_iterator(one_step))

  def _step_runner(self, train_metrics) -> steps_lib.StepRunner:
    return steps_lib.StepRunner(
        strategy=self.strategy, task=self.task, train_input=self.train_input,
        state=self.state, global_batch_size=self.length.global_batch_size,
        seed=self.config.seed, steps_per_epoch=self.length.steps_per_epoch,
        jit_compile=self.jit_compile,
        all_reduce_dtype=self.config.distribution.all_reduce_dtype,
        summary_steps=self.config.intervals.summary_steps,
        autograph=self.config.autograph,
        accumulate_steps=self.config.accumulate_steps,
        train_metrics=train_metrics, steps_done=self.watchdog.steps,
        input_wait=self.status.input_wait)

  def train(self) -> loop_lib.Stopped | None:
    """Trains to the last step, or until an action stops training.

    Raises:
      Preempted: after a checkpoint, when some worker received SIGTERM.
    """
    step = int(self.state.step.numpy())
    if self._stopped or step >= self.length.total_steps:
      return self._stopped
    train_metrics = metric_reading.MetricReader(self.task.train_metrics)
    runner = self._step_runner(train_metrics)
    intervals = self.config.intervals
    reporter = self.reporter = loop_lib.Reporter(
        length=self.length, metrics=train_metrics,
        writer=self.train_writer, speed=self.speed,
        when=When(steps=(intervals.log_steps, intervals.summary_steps),
                  epochs=1, at_end=True),
        summary_when=When(steps=intervals.summary_steps, epochs=1,
                          at_end=True))
    # Its sums since the last report, from the checkpoint resumed (still
    # in the variable: nothing was captured since).
    self.action_states.restore([reporter])
    self.loop = loop_lib.TrainLoop(
        runner=runner, length=self.length,
        steps_per_loop=self.config.steps_per_loop,
        actions=self._actions(reporter), reporter=reporter,
        stop_signal=self.stop_signal, speed=self.speed,
        strategy=self.strategy, task=self.task, workdir=self.workdir,
        is_chief=self.task_info.is_chief,
        num_workers=self.task_info.num_workers, started=self.started,
        restore_weights=self._restore_weights, progress=self.watchdog.beat,
        status=self.status)
    loops = self.loop.plan(int(self.state.step.numpy()))
    step_writer = summaries.step_summary_writer(
        workdir_lib.summary_dir(self.workdir, 'train'),
        self.task_info.is_chief)
    try:
      with step_writer.as_default():
        return self.loop.run(self.train_input.make_iterator(loops), loops)
    finally:
      step_writer.close()

  def _actions(self, reporter: loop_lib.Reporter) -> list[actions_lib.Action]:
    """ctl's actions and the task's, in the order they run after a loop:
    those that handle a diverging loss (a rollback, before anything reads
    the weights), report, evaluate (and what follows an evaluation),
    profile, the task's others, and last the checkpoint, so that it holds
    every decision of its step."""
    intervals = self.config.intervals
    call = actions_lib.Call
    first = [action for action in self.task_actions
             if action.handles_divergence]
    return [
        *first,
        reporter,
        call('worker-status', When(after_log=True), self.status.report),
        call('evaluate', When(steps=intervals.eval_steps, epochs=1,
                              at_end=True, on_request='evaluate'),
             self.evaluation),
        *builtin_actions.profile_actions(self.config.profile, self.workdir),
        *(action for action in self.task_actions if action not in first),
        call('checkpoint', When(
            steps=intervals.checkpoint_steps,
            epochs=intervals.checkpoint_epochs,
            secs=intervals.checkpoint_secs, at_end=True,
            on_request='checkpoint'), self._save),
    ]

  def _restore_weights(self) -> int:
    """The task's variables from the latest checkpoint; returns its step."""
    self.checkpointer.wait()
    path = self.checkpointer.latest
    if path is None:
      raise errors.CtlError(
          'The training loss diverged before the first checkpoint: there is '
          'nothing to roll back to. Lower the learning rate, or save '
          'earlier (config.intervals.checkpoint_steps).')
    checkpoint_contents.weights_checkpoint(self.task).read(path).expect_partial()
    return checkpoint_manager.step_of(path)

  def check_workdir(self) -> None:
    """Stops the run if the workdir vanished (the chief, which holds its
    lock): TensorFlow would write the next checkpoint into folders created
    anew, and the run would go on.

    Raises:
      CtlError: it was deleted, moved or replaced.
    """
    if self.workdir_lock.lost():
      raise failures.workdir_vanished(
          self.workdir, 'the folder this run locked is no longer there')

  def _save(self, event: actions_lib.Event) -> None:
    self.check_workdir()
    self.action_states.capture([*self.task_actions, self.reporter],
                               event.requests.get('stop'))
    self.data_positions.save(event.step)
    self.checkpointer.save(event.step)

  def run(self) -> dict:
    """restore_or_start, train and finish, with the writers open."""
    results = self.restore_or_start()
    if results is not None:
      return {**results, 'finished_now': False}
    self.status.start(step=int(self.state.step.numpy()),
                      total_steps=self.length.total_steps,
                      steps_per_epoch=self.length.steps_per_epoch,
                      num_epochs=self.length.num_epochs)
    self.train_writer = summaries.make_writer(
        workdir_lib.summary_dir(self.workdir, 'train'), self.task_info.is_chief)
    try:
      outcome = self.train()
      if self.evaluation.last is None:
        self.evaluation.evaluate(int(self.state.step.numpy()))
    finally:
      # Whatever happened, what was written so far is whole on disk, and
      # a background write's error is raised here (not at exit).
      try:
        self.train_writer.close()
        self.evaluation.close()
      finally:
        self.checkpointer.wait()
    return {**self.finish(outcome), 'finished_now': True}

  def finish(self, outcome: loop_lib.Stopped | None) -> dict:
    """The results: the state, the last evaluation, the weights'
    fingerprint, timing; in results.json (the chief)."""
    results = {
        **self.state.as_dict(),
        'eval': self.evaluation.last or {},
        'weights_sha256': state_lib.weights_fingerprint(self.task),
        # Of this process only: a resumed run's earlier ones are not in it.
        'timing': {
            'first_step_seconds': self.loop.first_step_seconds,
            'steps_per_second': self.speed.steady_steps_per_second(),
        } if self.loop else {},
    }
    if outcome is not None:
      results['stopped'] = {'step': outcome.step, 'reason': outcome.reason}
    # Every worker logs the fingerprint so that a multi-worker job can be
    # checked for replicas that drifted apart.
    logging.info('Final weights sha256 %s (task %s)', results['weights_sha256'],
                 self.task_info.name)
    if self.task_info.is_chief:
      storage.write_json(workdir_lib.results_path(self.workdir),
                             summaries.json_ready(results))
      logging.info('Results written to %s',
                   workdir_lib.results_path(self.workdir))
    return results


class _Evaluation:
  """The evaluate action: evaluates every eval set and keeps the best
  checkpoint; does nothing when the cluster has an evaluator task, which
  then does both."""

  def __init__(self, trainer: Trainer, best: best_lib.BestCheckpoint):
    self._checkpointer = trainer.checkpointer
    self._best = best
    self._check_workdir = trainer.check_workdir
    self._task, self._strategy = trainer.task, trainer.strategy
    self._ema = None  # Made at the first evaluation (optimizers built).
    self._evaluator = evaluation.Evaluator(
        strategy=trainer.strategy, task=trainer.task, context=trainer.context,
        eval_batch_size=trainer.length.eval_batch_size,
        seed=trainer.config.seed, autograph=trainer.config.autograph,
        make_writer=lambda name: summaries.make_writer(
            os.path.join(workdir_lib.summary_dir(trainer.workdir, 'eval'),
                         name), trainer.task_info.is_chief),
        watchdog=trainer.watchdog)
    self._enabled = not trainer.task_info.has_evaluator
    if not self._enabled:
      logging.info('The cluster\'s evaluator task evaluates the checkpoints: '
                   'training does not evaluate.')
    self.last = None  # The latest results.

  def __call__(self, event: actions_lib.Event) -> None:
    if self.evaluate(event.step) is not None:
      event.eval_results, event.evaluated = self.last, True

  def evaluate(self, step: int) -> dict | None:
    """Evaluates; keeps the best. None without eval data or evaluation."""
    if not self._enabled or not self._evaluator.has_data():
      return None
    if self._ema is None:
      self._ema = ema.EmaWeights(self._task, self._strategy)
    # With the optimizers' moving averages of the weights, if they keep
    # any; the best checkpoint is written with the training weights.
    with self._ema.swapped():
      self.last = self._evaluator.evaluate(step)
    # Every worker has the same (all-reduced) results, so all decide alike
    # and take part in the save.
    if self._best.improves(self.last):
      self._check_workdir()  # Before writing into it.
      self._best.keep(step, self.last, self._checkpointer.write_copy,
                      wait=self._checkpointer.wait)
    return self.last

  def close(self) -> None:
    """Closes the writers; records a best still being written, once it is."""
    self._evaluator.close()
    self._checkpointer.wait()
    self._best.finish()
