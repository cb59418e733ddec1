"""The Trainer: one run of a task, read as it happens.

    trainer = Trainer(config, workdir, ...)   # the task built, its input,
                                              # checkpoint, actions
    results = trainer.restore_or_start()      # None: there is training to do
    outcome = trainer.train()                 # the loop and its actions
    results = trainer.finish(outcome)         # final evaluation, results.json

Everything periodic (the log line, summaries, evaluation, the best
checkpoint, the profiler, the task's own actions, the checkpoint) is an
action of ctl/actions.py, which the loop (ctl/training/loop.py)
runs between loops of steps (ctl/training/steps.py). The run's checkpoint
(ctl/checkpoints/manager.TrainingCheckpoint) and the evaluate action
(ctl/training/evaluation.TrainingEvaluation) are handed to the loop: it
calls down into them, never back into the Trainer.
"""

from absl import logging
import ml_collections

from ctl import actions as actions_lib
from ctl import metric_writers
from ctl import storage
from ctl import task as task_lib
from ctl.checkpoints import contents as checkpoint_contents
from ctl.checkpoints import data_positions
from ctl.checkpoints import manager as checkpoint_manager
from ctl.cluster import distribution
from ctl.data import inputs
from ctl.metric_writers import tensorboard
from ctl.runtime import workdir as workdir_lib
from ctl.training import assemble as assemble_lib
from ctl.training import builtin_actions
from ctl.training import evaluation
from ctl.training import job as job_lib
from ctl.training import loop as loop_lib
from ctl.training import loop_plan
from ctl.training import parameter_servers
from ctl.training import pruning
from ctl.training import report
from ctl.training import state as state_lib
from ctl.training import steps as steps_lib
from ctl.training import task_calls
from ctl.training import worker_input

When = actions_lib.When


class Trainer:
  """A task built for training, with everything around its loop."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, *,
               task_class: type[task_lib.Task], job: job_lib.Job,
               process: job_lib.Process):
    """Args as named; job: the strategy, this worker's role, its watchdog
    (bounds each wait for a peer: told of each step, loop, action and
    evaluation batch) and its status file; process: SIGTERM's stop signal,
    the workdir's lock, the run's start-up."""
    self.config = config
    self.workdir = workdir
    self.job, self.process = job, process
    self.strategy = strategy = job.strategy
    self.role = role = job.role
    self.workdir_lock = process.workdir_lock
    self.watchdog = job.watchdog
    self.worker_status = job.worker_status
    assembled = assemble_lib.assemble(config, strategy, role, task_class,
                                      self.watchdog)
    self.task, self.train_state = assembled.task, assembled.train_state
    self.length, self.context = assembled.length, assembled.context
    self._build_input(assembled)
    self.checkpoint = self._training_checkpoint(assembled)
    self.logged_values = report.logged_values(
        config, workdir, role.is_chief, self.task)
    self.task_actions = [
        *(builtin_actions.from_config(config)  # Where a config asks for one.
          if config.early_stopping.metric or config.rollback.max_rollbacks
          else ()),
        self.logged_values,
        # A search's trial only (ctl.sweep sets config.search).
        *(pruning.from_config(config, role.is_chief)
          if config.search.storage else ()),
        *self.task.actions()]
    # The report's state is saved beside theirs, under its own name.
    stateful = [*self.task_actions, *self.logged_values.stateful_sinks]
    actions_lib.check_names([*stateful, report.Reporter])
    if role.has_evaluator and any(action.when.after_eval
                                  for action in self.task_actions):
      logging.warning('The cluster\'s evaluator task evaluates, so training '
                      'does not: actions after each evaluation (early '
                      'stopping) never run.')
    self.checkpoint.track(stateful)
    self.speed = report.SpeedMeter()
    self.loop = None  # The TrainLoop, once training starts.
    self._stopped = None  # An action's stop, restored from the checkpoint.
    self.evaluation = evaluation.for_training(
        config, workdir, task=self.task, context=self.context,
        job=(parameter_servers.evaluation_job(job)
             if distribution.is_parameter_server(strategy) else job),
        eval_batch_size=self.length.eval_batch_size,
        checkpoint=self.checkpoint)

  def _build_input(self, assembled: assemble_lib.Assembled) -> None:
    """Chooses XLA and makes the training input."""
    config = self.config
    if distribution.is_parameter_server(self.strategy):
      self.jit_compile = 'off'  # config_checks refuses XLA there.
      self.train_input = worker_input.PerWorkerInput(
          self.strategy, assembled.train_data, self.task.train_data,
          self.length.global_batch_size)
      return
    in_memory = isinstance(assembled.train_data, task_lib.InMemory)
    self.jit_compile = steps_lib.resolve_xla(
        config.jit_compile, num_replicas=self.strategy.num_replicas_in_sync,
        task=self.task, in_memory=in_memory)
    logging.info('XLA compiles: %s (config.jit_compile=%r)', self.jit_compile,
                 config.jit_compile)
    with assemble_lib.paused(self.watchdog):  # Reading data waits on no peer.
      self.train_input = inputs.train_input(
          self.strategy, assembled.train_data, seed=config.seed,
          length=self.length,
          pad_loops_to=(config.steps_per_loop if self.jit_compile == 'loop'
                        else None),
          num_local_replicas=distribution.local_replicas(self.strategy),
          context=self.context)

  def _training_checkpoint(
      self, assembled: assemble_lib.Assembled
  ) -> checkpoint_manager.TrainingCheckpoint:
    """The run's checkpoint: the model's, the data positions, the actions'
    states; saved by its intervals, at the end and on request."""
    config, role, workdir = self.config, self.role, self.workdir
    intervals = config.intervals
    # In-memory data has none: the step is its position.
    positions = data_positions.DataPositions(
        self.train_input.checkpointable,
        workdir_lib.data_position_dir(workdir),
        max_to_keep=intervals.keep_checkpoints,
        pipeline=role.worker_index, num_pipelines=role.num_workers
    ) if self.train_input.checkpointable else None
    model = checkpoint_manager.Checkpointer(
        assembled.checkpoint(), workdir_lib.checkpoint_dir(workdir),
        is_chief=role.is_chief, task_id=role.task_id,
        max_to_keep=intervals.keep_checkpoints,
        async_save=intervals.async_checkpoint, data=positions)
    return checkpoint_manager.TrainingCheckpoint(
        model, positions, assembled.action_states, task=self.task,
        state=self.train_state,
        when=When(steps=intervals.checkpoint_steps,
                  epochs=intervals.checkpoint_epochs,
                  secs=intervals.checkpoint_secs, at_end=True,
                  on_request='checkpoint'),
        workdir=workdir, workdir_lock=self.workdir_lock)

  def restore_or_start(self) -> dict | None:
    """Restores the latest checkpoint, or warm-starts, or starts at step 0;
    the results when training had finished before (nothing to do).

    Nothing is written before the run is known to start: a checkpoint that
    does not fit, or a finished run, leaves the workdir as it was.
    """
    if self.checkpoint.data:
      self.checkpoint.data.check_savable(self.train_input.dataset)
    restored = self.checkpoint.restore_latest(self.length.steps_per_epoch)
    if restored:
      if self.watchdog:
        self.watchdog.beat()
      if restored.stopped:  # An action stopped it here; killed before the end.
        self._stopped = loop_lib.Stopped(restored.step, restored.stopped)
    elif self.config.init_from:
      checkpoint_contents.warm_start(self.task, self.config.init_from,
                                     self.config.init_select)
    if self.role.num_workers > 1:
      state_lib.check_workers_agree(self.strategy, self.train_state)
    state_lib.note_partitions(self.train_state, self.train_input.partitions,
                              workdir_lib.checkpoint_dir(self.workdir))
    state_lib.note_workers(self.train_state, self.role.num_workers,
                           self.train_input.kind)
    step = int(self.train_state.step.numpy())
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
    if self.role.is_chief:
      workdir_lib.prepare(self.workdir)
      self.workdir_lock.acquire()  # A workdir that did not exist before.
      workdir_lib.remove_leftovers(self.workdir)
      self.checkpoint.checkpointer.remove_leftovers()
      self.evaluation.best.repair()
      workdir_lib.save_config(self.workdir, self.config)
    return None

  def _check_step_accumulates(self, step: int) -> None:
    """A step that ignores config.accumulate_steps (never calls
    ctx.accumulate) is a config mistake, refused before anything is
    written: traced once more, only for accumulating runs."""
    one_step = loop_plan.LoopPlan(step, step + 1,
                                  self.length.steps_per_epoch, 1)
    self._step_runner(task_calls.MetricReader([])).trace_step(
        self.train_input.make_iterator(one_step))

  def _step_runner(self, train_metrics) -> steps_lib.StepRunner:
    options = steps_lib.StepOptions.from_config(self.config, self.length,
                                                self.jit_compile)
    if distribution.is_parameter_server(self.strategy):
      return parameter_servers.ParameterServerRunner(
          self.strategy, self.task, self.train_state, options, train_metrics,
          self.process.stop_signal, self.config.distribution.timeout_seconds)
    return steps_lib.StepRunner(
        strategy=self.strategy, task=self.task, train_input=self.train_input,
        state=self.train_state, options=options, train_metrics=train_metrics,
        steps_done=self.watchdog.steps if self.watchdog else None,
        input_wait=self.worker_status.input_wait)

  def train(self) -> loop_lib.Stopped | None:
    """Trains to the last step, or until an action stops training.

    Raises:
      Preempted: after a checkpoint, when some worker received SIGTERM.
    """
    step = int(self.train_state.step.numpy())
    self.worker_status.start(step=step, total_steps=self.length.total_steps,
                             steps_per_epoch=self.length.steps_per_epoch,
                             num_epochs=self.length.num_epochs)
    writer = report.train_summaries(self.workdir, self.role.is_chief)
    try:
      if self._stopped or step >= self.length.total_steps:
        return self._stopped
      train_metrics = task_calls.MetricReader(self.task.train_metrics)
      reporter = self._reporter(train_metrics, writer)
      work = loop_lib.Work(self._actions(reporter), report=reporter,
                           checkpoint=self.checkpoint,
                           evaluation=self.evaluation)
      self.loop = loop_lib.TrainLoop(self._step_runner(train_metrics), work,
                                     self._wiring())
      return self._run_loop(step)
    finally:
      writer.close()  # What it wrote is whole on disk, whatever happened.

  def _reporter(self, train_metrics: task_calls.MetricReader,
                writer: metric_writers.MetricWriter) -> report.Reporter:
    """The report action, with its sums since the last report from the
    checkpoint resumed (saved in every checkpoint from now on)."""
    intervals = self.config.intervals
    reporter = report.Reporter(
        length=self.length, metrics=train_metrics, writer=writer,
        speed=self.speed,
        when=When(steps=(intervals.log_steps, intervals.summary_steps),
                  epochs=1, at_end=True),
        summary_when=When(steps=intervals.summary_steps, epochs=1,
                          at_end=True))
    self.checkpoint.track([reporter])
    return reporter

  def _wiring(self) -> loop_lib.Wiring:
    """What the loop reads and tells, besides its steps and actions."""
    return loop_lib.Wiring(
        length=self.length, steps_per_loop=self.config.steps_per_loop,
        task=self.task, workdir=self.workdir, job=self.job,
        process=self.process, speed=self.speed)

  def _run_loop(self, step: int) -> loop_lib.Stopped | None:
    """Runs the loop from `step`, with the steps' summary writer open."""
    loops = self.loop.plan(step)
    step_writer = tensorboard.step_summary_writer(
        workdir_lib.summary_dir(self.workdir, 'train'),
        self.role.is_chief)
    try:
      with step_writer.as_default():
        return self.loop.run(self.train_input.make_iterator(loops), loops)
    finally:
      step_writer.close()

  def _actions(self, reporter: report.Reporter) -> list[actions_lib.Action]:
    """ctl's actions and the task's, in the order they run after a loop
    (the checkpoint follows them, so that it holds every decision of its
    step): those that handle a diverging loss (a rollback, before anything
    reads the weights), report, evaluate (and what follows an evaluation),
    profile, the task's others."""
    first = [action for action in self.task_actions
             if action.handles_divergence]
    return [
        *first,
        reporter,
        actions_lib.Call('worker-status', When(after_log=True),
                         self.worker_status.report),
        self.evaluation,
        *(builtin_actions.profile_actions(self.config.profile, self.workdir)
          if self.config.profile.num_steps else ()),
        *(action for action in self.task_actions if action not in first),
    ]

  def run(self) -> tuple[dict, bool]:
    """restore_or_start, train, finish: (results, False if done before)."""
    results = self.restore_or_start()
    if results is not None:
      self.logged_values.send_left_over()  # Only a run's end sends them.
      return results, False
    try:
      outcome = self.train()
    except BaseException:
      self._close()
      raise
    return self.finish(outcome), True

  def _close(self) -> None:
    """Closes the eval writers and waits for every checkpoint write: what
    was written is whole on disk, and a background write's error is raised
    here (not at exit)."""
    try:
      self.evaluation.close()
    finally:
      self.checkpoint.checkpointer.wait(last=True)

  def finish(self, outcome: loop_lib.Stopped | None) -> dict:
    """The final evaluation (unless the last loop evaluated), then the
    results: the state, the last evaluation, the weights' fingerprint,
    timing; in results.json (the chief)."""
    try:
      if self.evaluation.last is None:
        self.evaluation.evaluate(int(self.train_state.step.numpy()))
    finally:
      self._close()
    results = {
        **self.train_state.as_dict(),
        'eval': self.evaluation.last or {},
        'best': self.evaluation.best.record(),
        'weights_sha256': state_lib.weights_fingerprint(self.task),
        'timing': self.loop.timing() if self.loop else {},
    }
    if outcome is not None:
      results['stopped'] = {'step': outcome.step, 'reason': outcome.reason}
    # Every worker logs the fingerprint so that a multi-worker job can be
    # checked for replicas that drifted apart.
    logging.info('Final weights sha256 %s (task %s)', results['weights_sha256'],
                 self.role.name)
    if self.role.is_chief:
      storage.write_json(workdir_lib.results_path(self.workdir),
                             metric_writers.json_ready(results))
      logging.info('Results written to %s',
                   workdir_lib.results_path(self.workdir))
    return results

