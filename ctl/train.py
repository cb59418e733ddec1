"""train_and_evaluate: builds everything from one config, then trains.

The loop runs `steps_per_loop` steps per tf.function call and stops a loop
early at every interval boundary, so that logs, summaries, evaluations and
checkpoints happen at exact steps, the same steps on every worker (metric
reads and checkpoint saves are collectives under MultiWorkerMirroredStrategy).
"""

import dataclasses
import datetime
import hashlib
import math
import os
import time

from absl import logging
import keras
import ml_collections
import numpy as np
import tensorflow as tf

from ctl import checkpointing
from ctl import config as config_lib
from ctl import datasets
from ctl import distribution
from ctl import errors
from ctl import input_pipeline
from ctl import metrics as metrics_lib
from ctl import models
from ctl import optimizers
from ctl import periodic
from ctl import preemption
from ctl import steps as steps_lib
from ctl import summaries
from ctl import workdir as workdir_lib


@dataclasses.dataclass(frozen=True)
class TrainingLength:
  """Batch sizes and step counts, resolved from the config and the data."""

  global_batch_size: int
  eval_batch_size: int
  steps_per_epoch: int
  total_steps: int

  @property
  def num_epochs(self) -> int:
    return -(-self.total_steps // self.steps_per_epoch)


def training_length(config: ml_collections.ConfigDict, num_train_examples: int,
                    num_replicas: int) -> TrainingLength:
  """Resolves the 0-means-default fields; raises ConfigError if they cannot work."""
  eval_batch_size = config.eval_batch_size or config.batch_size
  for key, batch_size in (('batch_size', config.batch_size),
                          ('eval_batch_size', eval_batch_size)):
    if batch_size % num_replicas:
      raise errors.ConfigError(
          f'config.{key}={batch_size} does not divide across the '
          f'{num_replicas} replicas of this job: use a multiple of '
          f'{num_replicas}.')
  steps_per_epoch = (config.steps_per_epoch or
                     num_train_examples // config.batch_size)
  if not steps_per_epoch:
    raise errors.ConfigError(
        f'config.batch_size={config.batch_size} is larger than the '
        f'{num_train_examples} training examples.')
  total_steps = config.total_steps or config.num_epochs * steps_per_epoch
  return TrainingLength(config.batch_size, eval_batch_size, steps_per_epoch,
                        total_steps)


def train_and_evaluate(config: ml_collections.ConfigDict,
                       workdir: str) -> dict:
  """Trains and evaluates as config says, resuming from workdir's checkpoint.

  Args:
    config: the whole config (see ctl/config.py).
    workdir: where checkpoints, summaries and results go (chief only).

  Returns:
    The results: final step, epoch and evaluation metrics, as saved in
    workdir/results.json.

  Raises:
    ConfigError: the config cannot work; nothing was written.
    Preempted: SIGTERM stopped training after a checkpoint at that step.
    PeerFailure: another worker died or hung; nothing half-done was saved.
    CtlError: the data, the workdir or a checkpoint is unusable, or the loss
      diverged; no checkpoint or result was overwritten.
  """
  started = process_start_time()
  config_lib.validate(config)
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  strategy, task = distribution.build_strategy(config.distribution)
  logging.info('Task %s of %d worker(s), %d replica(s) in sync, chief: %s',
               task.name, task.num_workers, strategy.num_replicas_in_sync,
               task.is_chief)
  timeout_seconds = config.distribution.timeout_seconds
  with preemption.StopSignal() as stop_signal:
    try:
      results = _run(config, workdir, strategy, task, stop_signal, started)
    except errors.Preempted:
      distribution.leave_together(task, timeout_seconds)
      raise
    except _PEER_ERRORS as error:
      if task.num_workers == 1:
        raise
      raise errors.PeerFailure(
          f'Lost the other workers ({type(error).__name__}): a worker died, '
          'was stopped, or did not respond within '
          f'distribution.timeout_seconds={timeout_seconds}'
          '. Nothing was saved after the latest checkpoint in '
          f'{workdir_lib.checkpoint_dir(workdir)}; restart every worker to '
          'resume from it.') from error
    except tf.errors.InvalidArgumentError as error:
      reason = _xla_failure(error)
      if reason is None:
        raise
      raise errors.CtlError(
          f'XLA cannot compile the training step of this model: {reason}. '
          'Run with --config.jit_compile=off (config.jit_compile='
          f'{config.jit_compile!r}). Nothing was trained.') from error
  distribution.leave_together(task, timeout_seconds)
  return results


def _xla_failure(error: tf.errors.OpError) -> str | None:
  """The line saying why XLA could not compile, if that is the error."""
  for line in error.message.splitlines():
    if 'trying to compile' in line and '_JIT' in line:
      return line.strip()[:500]
  return None


# What a collective raises when a peer is gone or too slow.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                tf.errors.AbortedError, tf.errors.CancelledError)


def _run(config: ml_collections.ConfigDict, workdir: str,
         strategy: tf.distribute.Strategy, task: distribution.Task,
         stop_signal: preemption.StopSignal, started: float) -> dict:
  """train_and_evaluate, once the strategy exists."""
  keras.utils.set_random_seed(config.seed)
  data = datasets.load(config.data)
  length = training_length(config, len(data.train),
                           strategy.num_replicas_in_sync)
  with strategy.scope():
    model = models.build_model(config.model, data.input_shape,
                               data.num_classes)
    optimizer = optimizers.build_optimizer(
        config.optimizer, length.total_steps,
        loss_scaling=config.model.dtype_policy == 'mixed_float16')
    # Builds the optimizer's slots now: lazily built slots fail with several
    # replicas, and a restore must find them to match the checkpoint.
    optimizer.build(model.trainable_variables)
    state = steps_lib.TrainState()
    train_metrics = metrics_lib.MetricSet(config.metrics)
    eval_metrics = metrics_lib.MetricSet(config.metrics)
  jit_compile = steps_lib.resolve_jit_compile(
      config.jit_compile, num_replicas=strategy.num_replicas_in_sync,
      model=model)
  logging.info('XLA compiles: %s (config.jit_compile=%r)', jit_compile,
               config.jit_compile)
  checkpointer = checkpointing.Checkpointer(
      checkpointing.training_checkpoint(model, optimizer, state),
      workdir_lib.checkpoint_dir(workdir), is_chief=task.is_chief,
      task_id=task.task_id, max_to_keep=config.intervals.keep_checkpoints,
      async_save=config.intervals.async_checkpoint)
  # Nothing is written before the run is known to start: a checkpoint that
  # does not fit, or a finished run, leaves the workdir as it was.
  if checkpointer.restore_latest():
    _check_resumable(state, length)
  elif config.init_from:
    checkpointing.warm_start(model, config.init_from)
  if task.num_workers > 1:
    _check_workers_agree(strategy, state)

  step = int(state.step.numpy())
  results = workdir_lib.read_results(workdir)
  if step >= length.total_steps and results is not None:
    logging.info('Training already finished at step %d of %d: nothing to do. '
                 'Results: %s', step, length.total_steps,
                 workdir_lib.results_path(workdir))
    return results
  if task.is_chief:
    workdir_lib.prepare(workdir)
    workdir_lib.save_config(workdir, config)

  steps = steps_lib.Steps(
      strategy=strategy, model=model, optimizer=optimizer,
      train_data=input_pipeline.InMemory(data.train, data.feature_scale),
      loss_fn=metrics_lib.build_loss(config.loss),
      train_metrics=train_metrics, eval_metrics=eval_metrics, state=state,
      global_batch_size=length.global_batch_size,
      steps_per_epoch=length.steps_per_epoch,
      steps_per_loop=config.steps_per_loop, jit_compile=jit_compile,
      all_reduce_dtype=config.distribution.all_reduce_dtype)
  train_writer = summaries.make_writer(
      workdir_lib.summary_dir(workdir, 'train'), task.is_chief)
  eval_writer = summaries.make_writer(
      workdir_lib.summary_dir(workdir, 'eval'), task.is_chief)
  try:
    evaluator = _Evaluator(strategy, steps, eval_metrics, data, length,
                           eval_writer)
    eval_results, timing = None, {}
    if step < length.total_steps:
      loop = _TrainLoop(
          config=config, length=length, steps=steps,
          train_metrics=train_metrics, evaluator=evaluator,
          checkpointer=checkpointer, stop_signal=stop_signal,
          writer=train_writer, started=started)
      loops = loop.plan(step)
      train_iterator = iter(strategy.distribute_datasets_from_function(
          lambda context: input_pipeline.train_chunks(
              len(data.train), seed=config.seed,
              global_batch_size=length.global_batch_size,
              steps_per_epoch=length.steps_per_epoch, loops=loops,
              context=context)))
      eval_results = loop.run(train_iterator, loops)
      timing = loop.timing()
    if eval_results is None:  # Finished earlier, stopped before its results.
      eval_results = evaluator.evaluate(int(state.step.numpy()))
  finally:
    # Whatever happened, what was written so far is whole on disk.
    train_writer.close()
    eval_writer.close()
    checkpointer.wait()

  results = {
      **state.as_dict(),
      'eval': eval_results,
      'weights_sha256': weights_fingerprint(model),
      # Of this process only: a resumed run's earlier processes are not in it.
      'timing': timing,
  }
  # Every worker logs the fingerprint so that a multi-worker job can be
  # checked for replicas that drifted apart.
  logging.info('Final weights sha256 %s (task %s)', results['weights_sha256'],
               task.name)
  if task.is_chief:
    workdir_lib.write_json(workdir_lib.results_path(workdir), results)
    logging.info('Results written to %s', workdir_lib.results_path(workdir))
  return results


def weights_fingerprint(model: keras.Model) -> str:
  """A SHA-256 of every weight's bytes: equal only for identical weights."""
  digest = hashlib.sha256()
  for weight in model.weights:
    digest.update(np.ascontiguousarray(weight.numpy()).tobytes())
  return digest.hexdigest()


class _Evaluator:
  """Runs one pass over the eval split and reports it."""

  def __init__(self, strategy, steps, eval_metrics, data, length, writer):
    self._steps = steps
    self._metrics = eval_metrics
    self._writer = writer
    self._num_steps = tf.constant(
        input_pipeline.num_eval_steps(len(data.eval), length.eval_batch_size))
    self._make_iterator = lambda: iter(
        strategy.distribute_datasets_from_function(
            lambda context: input_pipeline.eval_dataset(
                data.eval, feature_scale=data.feature_scale,
                global_batch_size=length.eval_batch_size, context=context)))
    self._iterator = None

  def evaluate(self, step: int) -> dict[str, float]:
    """Evaluates the current weights; logs and summarises them at step."""
    if self._iterator is None:
      # Made at the first evaluation, not before the first training step
      # (it costs ~0.4 s). The dataset repeats and each pass is whole, so
      # one iterator serves every evaluation.
      self._iterator = self._make_iterator()
    self._steps.eval_loop(self._iterator, self._num_steps)
    results = self._metrics.read_and_reset()
    self._writer.write_scalars(step, results)
    logging.info('eval at step %d: %s', step, _format(results))
    return results


class _TrainLoop:
  """The Python loop around train_loop: when to log, evaluate, save and stop."""

  def __init__(self, *, config, length, steps, train_metrics, evaluator,
               checkpointer, stop_signal, writer, started):
    intervals = config.intervals
    self._log = periodic.Periodic(intervals.log_steps)
    self._summary = periodic.Periodic(intervals.summary_steps)
    self._eval = periodic.Periodic(intervals.eval_steps)
    self._checkpoint = periodic.Periodic(intervals.checkpoint_steps,
                                         intervals.checkpoint_secs)
    self._checkpoint_epochs = periodic.Periodic(
        length.steps_per_epoch * intervals.checkpoint_epochs)
    self._steps_per_loop = config.steps_per_loop
    self._length = length
    self._steps = steps
    self._train_metrics = train_metrics
    self._evaluator = evaluator
    self._checkpointer = checkpointer
    self._stop_signal = stop_signal
    self._writer = writer
    self._started = started
    self._speed = _SpeedMeter()
    self.first_step_seconds = None

  def timing(self) -> dict[str, float | None]:
    """How fast this process trained: start-up and steady speed."""
    return {'first_step_seconds': self.first_step_seconds,
            'steps_per_second': self._speed.steady_steps_per_second()}

  def plan(self, step: int) -> list[tuple[int, int]]:
    """The (first step, end step) of each loop from `step` to the end.

    A loop ends at every epoch end and every step interval, after at most
    steps_per_loop steps. The first is one step: it traces the functions,
    and its end times the start-up exactly.
    """
    loops = [(step, step + 1)]
    while loops[-1][1] < self._length.total_steps:
      start = loops[-1][1]
      loops.append((start, start + self._steps_to_next_stop(start)))
    return loops

  def run(self, iterator, loops: list[tuple[int, int]]
          ) -> dict[str, float] | None:
    """Runs the planned loops; returns the last evaluation's results.

    Raises:
      Preempted: after saving, when some worker received SIGTERM.
    """
    eval_results = None
    total_steps = self._length.total_steps
    logging.info('Training from step %d to %d (epoch %d of %d, %d steps each)',
                 loops[0][0], total_steps,
                 loops[0][0] // self._length.steps_per_epoch + 1,
                 self._length.num_epochs, self._length.steps_per_epoch)
    for previous_step, step in loops:
      num_steps = step - previous_step
      requests = tf.constant(
          [self._stop_signal.requested, self._checkpoint.due_by_time()],
          tf.int32)
      self._speed.start()
      outputs = self._steps.train_loop(iterator, tf.constant(num_steps),
                                       requests)
      loss = float(outputs['loss'])
      stop, save_now = (outputs['requests'].numpy() > 0).tolist()
      if self._speed.stop(num_steps):
        self.first_step_seconds = _seconds_since(self._started)
        logging.info('First step done %.1f s after the process started',
                     self.first_step_seconds)
      if not math.isfinite(loss):
        where = (f'at step {step}' if num_steps == 1 else
                 f'in steps {previous_step + 1}..{step}')
        raise errors.CtlError(
            f'The training loss is {loss} after step {step}: it diverged '
            f'{where}. Nothing was saved after step {previous_step}. Lower the '
            'learning rate, or run with --config.steps_per_loop=1 to find the '
            'exact step.')
      end_of_epoch = (step % self._length.steps_per_epoch == 0 or
                      step == total_steps)
      if end_of_epoch or self._log.due_at(step) or self._summary.due_at(step):
        self._report(step, float(outputs['learning_rate']),
                     write_summary=end_of_epoch or self._summary.due_at(step))
      if end_of_epoch or self._eval.due_at(step):
        eval_results = self._evaluator.evaluate(step)
      if (save_now or stop or step == total_steps or
          self._checkpoint.due_at(step) or self._checkpoint_epochs.due_at(step)):
        self._checkpointer.save(step)
        self._checkpoint.done()
      if stop and step < total_steps:
        raise errors.Preempted(
            f'Stopped by SIGTERM after step {step} of {total_steps}, with a '
            f'checkpoint of step {step} in {self._checkpointer.directory}. '
            'Run the same command again to resume from it.')
    return eval_results

  def _steps_to_next_stop(self, step: int) -> int:
    """Steps until the next loop end, epoch end or step interval."""
    until_epoch_end = (self._length.steps_per_epoch -
                       step % self._length.steps_per_epoch)
    stops = [self._steps_per_loop, self._length.total_steps - step,
             until_epoch_end]
    for action in (self._log, self._summary, self._eval, self._checkpoint,
                   self._checkpoint_epochs):
      stops.append(action.steps_until_due(step) or stops[0])
    return min(stops)

  def _report(self, step: int, learning_rate: float,
              write_summary: bool) -> None:
    """Reads the train metrics (on every worker), then logs and summarises."""
    scalars = self._train_metrics.read_and_reset()
    scalars['learning_rate'] = learning_rate
    steps_per_second = self._speed.steps_per_second()
    if steps_per_second:
      scalars['steps_per_second'] = steps_per_second
      scalars['examples_per_second'] = (
          steps_per_second * self._length.global_batch_size)
    if write_summary:
      self._writer.write_scalars(step, scalars)
    # Counted from 1: "epoch 1, step 22 of 22" is the end of the first epoch.
    epoch = -(-step // self._length.steps_per_epoch)
    step_in_epoch = step - (epoch - 1) * self._length.steps_per_epoch
    eta = self._speed.eta_seconds(step, self._length.total_steps)
    logging.info(
        'step %d/%d epoch %d/%d (step %d of %d) | %s | ETA %s', step,
        self._length.total_steps, epoch, self._length.num_epochs,
        step_in_epoch, self._length.steps_per_epoch, _format(scalars),
        datetime.timedelta(seconds=round(eta)) if eta is not None else '?')


class _SpeedMeter:
  """Times train loops; the first (it traces the functions) is left out."""

  def __init__(self, clock=time.monotonic):
    self._clock = clock
    self._loop_started = 0.0
    self._steps = 0  # Since the last steps_per_second().
    self._seconds = 0.0
    self._loop_ends = []  # (steps trained, time) after each loop.

  @property
  def started(self) -> bool:
    return bool(self._loop_ends)

  def start(self) -> None:
    self._loop_started = self._clock()

  def stop(self, num_steps: int) -> bool:
    """Records a loop of num_steps steps; returns whether it was the first."""
    now = self._clock()
    first = not self._loop_ends
    trained = num_steps + (self._loop_ends[-1][0] if self._loop_ends else 0)
    self._loop_ends.append((trained, now))
    if not first:
      self._steps += num_steps
      self._seconds += now - self._loop_started
    return first

  def steps_per_second(self) -> float | None:
    """Training speed since the last call, inside train loops only."""
    speed = self._steps / self._seconds if self._seconds else None
    self._steps, self._seconds = 0, 0.0
    return speed

  def steady_steps_per_second(self) -> float | None:
    """Speed over the second half of the steps trained, periodic work included.

    By then every function has been traced once (the first report, eval and
    save each trace one); a long run is dominated by this speed.
    """
    if len(self._loop_ends) < 2:
      return None
    trained, now = self._loop_ends[-1]
    half = next(end for end in self._loop_ends if end[0] >= trained / 2)
    if half[0] == trained:
      half = self._loop_ends[-2]
    return (trained - half[0]) / (now - half[1])

  def eta_seconds(self, step: int, total_steps: int) -> float | None:
    """Time left at the pace since the first loop, evaluations included."""
    if len(self._loop_ends) < 2:
      return None
    (first_steps, first_time), (steps, now) = (self._loop_ends[0],
                                               self._loop_ends[-1])
    pace = (self._clock() - first_time) / (steps - first_steps)
    return pace * (total_steps - step)


def process_start_time() -> float:
  """time.monotonic() when this process started (Linux), else now."""
  try:
    with open('/proc/self/stat') as file:
      # Field 22, after the parenthesised command name, in clock ticks.
      start_ticks = int(file.read().rsplit(')', 1)[1].split()[19])
    with open('/proc/uptime') as file:
      uptime = float(file.read().split()[0])
    age = uptime - start_ticks / os.sysconf('SC_CLK_TCK')
    return time.monotonic() - age
  except (OSError, ValueError, IndexError):
    return time.monotonic()


def _seconds_since(start: float) -> float:
  return time.monotonic() - start


def _check_resumable(state: steps_lib.TrainState,
                     length: TrainingLength) -> None:
  """Fails if the config cuts epochs differently from the checkpoint's."""
  position = state.as_dict()
  expected = divmod(position['step'], length.steps_per_epoch)
  if (position['epoch'], position['step_in_epoch']) != expected:
    raise errors.ConfigError(
        f"The checkpoint stopped at step {position['step']}, epoch "
        f"{position['epoch']} step {position['step_in_epoch']} of its epoch, "
        f'but this config has {length.steps_per_epoch} steps per epoch, so '
        'the data would not resume where it stopped. Resume with the config '
        'that wrote the checkpoint (batch_size, steps_per_epoch, data), or '
        'train in a new --workdir.')


def _check_workers_agree(strategy: tf.distribute.Strategy,
                         state: steps_lib.TrainState) -> None:
  """Fails if workers restored different steps (each must see the workdir)."""
  @tf.function(autograph=False)
  def mean_step():
    return strategy.reduce(
        tf.distribute.ReduceOp.MEAN,
        strategy.run(lambda: tf.cast(state.step, tf.float64)), axis=None)

  local, mean = float(state.step.numpy()), float(mean_step())
  if mean != local:
    raise errors.CtlError(
        f'This worker restored step {int(local)} but the workers average '
        f'{mean}: every worker must read the same workdir (a shared '
        'filesystem) to resume.')


def _format(scalars: dict[str, float]) -> str:
  return ' '.join(f'{name} {format_number(value)}'
                  for name, value in scalars.items())


def format_number(value: float) -> str:
  """Four significant digits, never in scientific notation: 0.0001234, 18820."""
  if not math.isfinite(value):
    return str(value)
  return np.format_float_positional(value, precision=4, unique=False,
                                    fractional=False, trim='-')
