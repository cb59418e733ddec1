"""The Python loop around train_loop: runs loops of steps and, after each,
the actions due (ctl/actions.py).

Loops end at every step where some action is due by its step or epoch
count or once (`When.at_steps`), so that logs, summaries, evaluations,
checkpoints and a task's own actions happen at exact steps, the same on
every worker (metric reads and checkpoint saves are collectives under
MultiWorkerMirroredStrategy). No action is special: the checkpoint is the
last of the list, due by its intervals, at the end, and on request
(SIGTERM, its time interval, or an action's).
"""

from collections.abc import Callable, Sequence
import dataclasses
import datetime
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf

from ctl import errors
from ctl.cluster import worker_status
from ctl.training import failures
from ctl.training import loop_plan
from ctl.runtime import preemption
from ctl.runtime import progress
from ctl.runtime import summaries
from ctl import actions as actions_lib
from ctl.training import metric_reading
from ctl.training import speed as speed_lib
from ctl.training import state as state_lib

# The loop arguments kept as tensors (TrainLoop._int32_tensor).
_MAX_TENSORS = 256


@dataclasses.dataclass(frozen=True)
class Stopped:
  """Training stopped before its last step because an action asked."""

  step: int
  reason: str


class TrainLoop:
  """Runs planned loops of steps; after each, the checks and the actions
  due, in their order."""

  def __init__(self, *, runner, length: state_lib.TrainingLength,
               steps_per_loop: int, actions: Sequence[actions_lib.Action],
               reporter: 'Reporter', stop_signal: preemption.StopSignal,
               speed: speed_lib.SpeedMeter, strategy: tf.distribute.Strategy,
               task, workdir: str, is_chief: bool, num_workers: int,
               started: float, restore_weights: Callable[[], int],
               progress: Callable[[], None] = lambda: None,
               status: worker_status.WorkerStatus | None = None):
    """Args as named.

    Args:
      runner: a ctl.training.steps.StepRunner.
      actions: in the order they run after a loop.
      reporter: gets each loop's logs; its report is one of the actions.
      started: when the process started (speed_lib.process_start_time).
      restore_weights: puts back the task's variables from the latest
        checkpoint, not the step or the data position; returns its step
        (for an action's rollback request).
      progress: called after each loop and action (the watchdog's beat).
      status: times each loop and action (this worker's status file).
    """
    self._runner = runner
    self._length = length
    self._steps_per_loop = steps_per_loop
    self._actions = list(actions)
    self._reporter = reporter
    self._stop_signal = stop_signal
    self._speed = speed
    self._task = task
    self._workdir = workdir
    self._is_chief = is_chief
    self._num_workers = num_workers
    self._started = started
    self._restore_weights = restore_weights
    self._progress = progress
    self._status = status or worker_status.WorkerStatus(None)
    # Unless an action handles it (a rollback), a log that is not finite
    # stops the run before any action runs.
    self._stop_on_divergence = not any(action.handles_divergence
                                       for action in self._actions)
    self._worker_sum = metric_reading.WorkerSum(strategy)
    # The actions due by time, on some worker's clock, agreed in train_loop.
    self._clocks = {index: actions_lib.Clock(action.when.secs)
                    for index, action in enumerate(self._actions)
                    if action.when.secs}
    self.eval_results = None  # The latest evaluation's.
    self.first_step_seconds = None
    self._tensors = {}  # {value: int32 tensor}, see _int32_tensor.

  def plan(self, step: int) -> loop_plan.LoopPlan:
    """The loops from `step` to the end: they end where some action is due
    by its step or epoch count, or once (the one-off steps still ahead)."""
    every = sorted({every for action in self._actions
                    for every in action.when.step_intervals(
                        self._length.steps_per_epoch)})
    at = sorted({at for action in self._actions
                 for at in action.when.one_off_steps()
                 if step < at < self._length.total_steps})
    return loop_plan.LoopPlan(step, self._length.total_steps,
                             self._length.steps_per_epoch,
                             self._steps_per_loop, tuple(every), tuple(at))

  def run(self, iterator, loops: loop_plan.LoopPlan) -> Stopped | None:
    """Runs the planned loops and the actions due after each.

    Returns:
      Stopped when an action stopped training early; None at the end.

    Raises:
      Preempted: after saving, when some worker received SIGTERM.
      CtlError: when a log is not finite (nothing saved after the loop
        before).
    """
    total_steps = self._length.total_steps
    logging.info('Training from step %d to %d (epoch %d of %d, %d steps each)',
                 loops.start, total_steps,
                 loops.start // self._length.steps_per_epoch + 1,
                 self._length.num_epochs, self._length.steps_per_epoch)
    for previous_step, step in loops:
      preempted, time_due, logs = self._train(iterator, previous_step, step)
      event = actions_lib.Event(
          step=step, steps_per_epoch=self._length.steps_per_epoch,
          total_steps=total_steps, task=self._task, workdir=self._workdir,
          is_chief=self._is_chief, train_logs=self._reporter.latest,
          eval_results=self.eval_results, loop_means=logs,
          first_step=previous_step)
      if preempted:
        event.request_checkpoint()
      self._run_actions(event, time_due)
      # An action's stop first: its checkpoint says training ended there.
      if 'stop' in event.requests and step < total_steps:
        reason = event.requests['stop']
        logging.info('Stopped at step %d of %d: %s', step, total_steps, reason)
        return Stopped(step, reason)
      if preempted and step < total_steps:
        raise errors.Preempted(
            f'Stopped by {self._stop_signal.received or "SIGTERM"} after step '
            f'{step} of {total_steps}, with a '
            f'checkpoint of step {step}. Run the same command again to '
            'resume from it.')
    return None

  def _train(self, iterator, previous_step: int,
             step: int) -> tuple[bool, set[int], dict[str, float]]:
    """One loop of steps; whether some worker asked to stop (SIGTERM), the
    actions some worker's clock says are due, and the loop's logs."""
    num_steps = step - previous_step
    timed = sorted(self._clocks)
    requests = self._int32_tensor((
        self._stop_signal.requested,
        *(self._clocks[index].due() for index in timed)))
    self._speed.start()
    with self._status.phase('training', step):
      outputs = self._runner.train_loop(
          iterator, self._int32_tensor(num_steps), requests,
          read_metrics=self._reporter.due_at(step))
      logs = {name: float(value) for name, value in outputs['logs'].items()}
    loop_logs = {name: float(value)
                 for name, value in outputs['loop_logs'].items()}
    agreed = (outputs['requests'].numpy() > 0).tolist()
    if self._speed.stop(num_steps):
      self.first_step_seconds = speed_lib.seconds_since(self._started)
      # A resumed run's first loop is as long as an uninterrupted run's.
      logging.info('%s done %.1f s after the process started',
                   'First step' if num_steps == 1 else
                   f'First loop (steps {previous_step + 1}..{step})',
                   self.first_step_seconds)
    if self._stop_on_divergence:
      failures.check_finite(logs, previous_step, step)
    self._reporter.add(logs, num_steps, loop_logs, outputs.get('metrics'))
    return (agreed[0],
            {index for index, due in zip(timed, agreed[1:]) if due}, logs)

  def _int32_tensor(self, value: int | tuple[bool, ...]) -> tf.Tensor:
    """value as an int32 tensor, made once: a loop's arguments take few
    values (its length, the request flags), and making them anew cost each
    loop of the MLP 0.1-0.17 ms (BENCHMARKS.md, "Per-loop costs")."""
    if value not in self._tensors:
      if len(self._tensors) >= _MAX_TENSORS:  # Memory stays bounded.
        self._tensors.clear()
      self._tensors[value] = tf.constant(value, tf.int32)
    return self._tensors[value]

  def _run_actions(self, event: actions_lib.Event, time_due: set[int]) -> None:
    """Runs the actions due, in order; a request, a log line or an
    evaluation can make later and earlier ones due. Each runs once, or
    again for a log line or evaluation that came after it ran (a stop
    requested after the log writes the log line at the end).

    A chief-only action's requests count once the workers agreed on them
    (one small all-reduce): every worker knows which actions are due, so
    every worker takes part.
    """
    ran = {}  # {index: (logged, evaluated) when it ran}
    rolled_back = False
    while True:
      self._progress()  # After the loop, and after each action.
      if 'rollback' in event.requests and not rolled_back:
        rolled_back = True
        self._roll_back(event)
      due = next((index for index, action in enumerate(self._actions)
                  if self._due(action, index, event, time_due, ran)), None)
      if due is None:
        break
      ran[due] = (event.logged, event.evaluated)
      action = self._actions[due]
      if due in self._clocks:
        self._clocks[due].reset()
      if action.on_every_worker or self._num_workers == 1:
        with self._status.phase(action.name):
          action.run(event)
        continue
      before = dict(event.requests)
      if self._is_chief:
        with self._status.phase(action.name):
          action.run(event)
      made = {name: reason for name, reason in event.requests.items()
              if name not in before}
      event.requests = {**before, **self._agree(made)}
    self.eval_results = event.eval_results

  def _roll_back(self, event: actions_lib.Event) -> None:
    """Puts back the latest checkpoint's weights; the data goes on."""
    restored = self._restore_weights()
    self._reporter.restored()
    logging.warning(
        'Rolled back after step %d: %s. The weights of step %d are back; '
        'the data of steps %d..%d is skipped.', event.step,
        event.requests['rollback'], restored, restored + 1, event.step)

  def _agree(self, requests: dict[str, str]) -> dict[str, str]:
    """The chief's requests, on every worker."""
    flags = np.array([name in requests for name in actions_lib.REQUESTS],
                     np.float64)
    agreed = self._worker_sum(flags)
    return {name: requests.get(name, 'an action on the chief asked')
            for name, flag in zip(actions_lib.REQUESTS, agreed) if flag > 0}

  def _due(self, action: actions_lib.Action, index: int,
           event: actions_lib.Event, time_due: set[int],
           ran: dict[int, tuple[bool, bool]]) -> bool:
    when = action.when
    if index in ran:
      logged, evaluated = ran[index]
      return bool((when.after_log and event.logged and not logged) or
                  (when.after_eval and event.evaluated and not evaluated))
    return bool(
        when.due_at(event.step, self._length.steps_per_epoch, event.end) or
        (when.after_log and event.logged) or
        (when.after_eval and event.evaluated) or
        when.every_loop or
        (when.on_request and when.on_request in event.requests) or
        index in time_due)


class Reporter(actions_lib.Action):
  """The report action: logs and summarises the task's logs and metrics.

  The task's logs are averaged over the steps since the last report; the
  train metrics are read (on every worker: a collective) and reset. The
  logs' running sums are in every checkpoint (its state): a resumed run's
  first report averages the same steps as an uninterrupted run's (the
  train metrics, not in the checkpoint, count the steps since the resume).
  A rollback starts both anew: the next report covers the steps trained
  after it.
  """

  # Its state's key among the actions' states; a task's action named so is
  # refused (Trainer), as two actions sharing a name are.
  name = 'ctl.report'
  on_every_worker = True

  def __init__(self, *, length: state_lib.TrainingLength,
               metrics: metric_reading.MetricReader,
               writer: summaries.MetricWriter, speed: speed_lib.SpeedMeter,
               when: actions_lib.When, summary_when: actions_lib.When):
    """Args as named; when: the report action's, summary_when: the
    summaries' (a report writes them when both are due)."""
    self.when = when
    self._length = length
    self._metrics = metrics
    self._writer = writer
    self._speed = speed
    self._summary_when = summary_when
    self._sums: dict[str, float] = {}
    self._steps = 0
    self._latest: dict[str, float] = {}  # The latest loop's loop_logs.
    self._metric_results = None  # Read by the loop, for the next report.
    self.latest: dict[str, float] = {}  # The latest report's values.

  def due_at(self, step: int) -> bool:
    """Whether the report is due after `step` by its counts or as the end
    of training (not by a request: a stop's report reads the metrics
    itself)."""
    return self.when.due_at(step, self._length.steps_per_epoch,
                            step >= self._length.total_steps)

  def add(self, logs: dict[str, float], num_steps: int,
          loop_logs: dict[str, float], metric_results=None) -> None:
    """Adds a loop's mean logs; keeps its loop_logs, the latest, and the
    train metrics' results if the loop read them (then reset them)."""
    for name, value in logs.items():
      self._sums[name] = self._sums.get(name, 0.0) + value * num_steps
    self._steps += num_steps
    self._latest = loop_logs
    if metric_results is not None:
      self._metric_results = metric_reading.as_python(metric_results)

  def restored(self) -> None:
    """After a rollback: the steps since the last report are dropped (their
    logs, loop_logs and train metrics); the next report covers the steps
    after it."""
    self._sums, self._steps, self._latest = {}, 0, {}
    self._metric_results = None
    self._metrics.reset()

  def state(self) -> dict[str, Any]:
    """The logs' sums since the last report (JSON keeps a float exact)."""
    return {'sums': self._sums, 'steps': self._steps}

  def restore(self, state: dict[str, Any]) -> None:
    """Takes back the sums state() returned at the checkpoint resumed."""
    self._sums, self._steps = dict(state['sums']), state['steps']

  def run(self, event: actions_lib.Event) -> None:
    """As an action: the report."""
    self.report(event)

  def report(self, event: actions_lib.Event) -> None:
    """Logs (and at summary steps summarises) everything since the last."""
    if not self._steps:
      # A rollback at this step left no step to report (its warning says
      # so): no log line; the actions after one do not run.
      return
    step = event.step
    scalars = {name: total / self._steps for name, total in self._sums.items()}
    self._sums, self._steps = {}, 0
    scalars.update(self._latest)
    if self._metric_results is None:
      self._metric_results = self._metrics.read_and_reset()
    scalars.update(self._metric_results)
    self._metric_results = None
    steps_per_second = self._speed.steps_per_second()
    if steps_per_second:
      scalars['steps_per_second'] = steps_per_second
      scalars['examples_per_second'] = (
          steps_per_second * self._length.global_batch_size)
    if self._summary_when.due_at(step, self._length.steps_per_epoch,
                                 event.end):
      self._writer.write(step, scalars)
    self.latest = event.train_logs = scalars
    event.logged = True
    # Counted from 1: "epoch 1, step 22 of 22" is the end of the first epoch.
    epoch = -(-step // self._length.steps_per_epoch)
    step_in_epoch = step - (epoch - 1) * self._length.steps_per_epoch
    eta = self._speed.eta_seconds(step, self._length.total_steps)
    line = 'step %d/%d epoch %d/%d (step %d of %d) | %s | ETA %s' % (
        step, self._length.total_steps, epoch, self._length.num_epochs,
        step_in_epoch, self._length.steps_per_epoch,
        summaries.format_scalars(scalars),
        datetime.timedelta(seconds=round(eta)) if eta is not None else '?')
    live = progress.live_stream()
    if live and step_in_epoch != self._length.steps_per_epoch and not (
        event.end):
      live.show(line)  # On a terminal; epoch ends and the end scroll.
      return
    if live:
      live.show('')
    logging.info('%s', line)

