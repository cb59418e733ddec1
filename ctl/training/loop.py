"""The Python loop around train_loop: runs loops of steps and, after each,
the actions due (ctl/actions.py).

Loops end at every step where some action is due by its step or epoch
count or once (`When.at_steps`), so that logs, summaries, evaluations,
checkpoints and a task's own actions happen at exact steps, the same on
every worker (metric reads and checkpoint saves are collectives under
MultiWorkerMirroredStrategy). No action is special: the checkpoint is the
last of the list, due by its intervals, at the end, and on request
(SIGTERM, its time interval, or an action's).

The loop calls down only: it is handed the run's checkpoint
(ctl/checkpoints/manager.TrainingCheckpoint), which it saves as its last
action and whose weights it puts back on an action's rollback.
"""

from collections.abc import Sequence
import dataclasses
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf

from ctl import actions as actions_lib
from ctl import errors
from ctl.checkpoints import manager as checkpoint_manager
from ctl.cluster import distribution
from ctl.cluster import watchdog as watchdog_lib
from ctl.cluster import worker_status
from ctl.runtime import preemption
from ctl.training import failures
from ctl.training import loop_plan
from ctl.training import metric_reading
from ctl.training import report
from ctl.training import speed as speed_lib
from ctl.training import state as state_lib

# The loop arguments kept as tensors (TrainLoop._int32_tensor).
_MAX_TENSORS = 256


@dataclasses.dataclass(frozen=True)
class Stopped:
  """Training stopped before its last step because an action asked."""

  step: int
  reason: str


@dataclasses.dataclass(frozen=True)
class Wiring:
  """What the loop reads and tells, besides its steps and actions.

  Attributes:
    length: the run's batch sizes and step counts.
    steps_per_loop: the most steps in one loop.
    strategy: the distribution strategy (the workers' agreements).
    task_info: this worker's place in the job.
    task: the ctl.Task (handed to the actions in each Event).
    workdir: the run's workdir.
    stop_signal: SIGTERM's request to stop.
    speed: times the loops.
    started: when the process started (speed_lib.process_start_time).
    watchdog: told of each loop and action (multi-worker); None for one
      worker.
    status: times each loop and action (this worker's status file).
  """

  length: state_lib.TrainingLength
  steps_per_loop: int
  strategy: tf.distribute.Strategy
  task_info: distribution.Role
  task: Any
  workdir: str
  stop_signal: preemption.StopSignal
  speed: speed_lib.SpeedMeter
  started: float
  watchdog: watchdog_lib.Watchdog | None
  status: worker_status.WorkerStatus


class TrainLoop:
  """Runs planned loops of steps; after each, the checks and the actions
  due, in their order, the checkpoint last."""

  def __init__(self, wiring: Wiring, *, runner, reporter: report.Reporter,
               actions: Sequence[actions_lib.Action],
               checkpoint: checkpoint_manager.TrainingCheckpoint):
    """Args as named.

    Args:
      runner: a ctl.training.steps.StepRunner.
      reporter: gets each loop's logs; its report is one of the actions.
      actions: in the order they run after a loop, before the checkpoint.
      checkpoint: saved as the last action; rolled back to (the weights
        only) on an action's request.
    """
    self._runner = runner
    self._length = wiring.length
    self._steps_per_loop = wiring.steps_per_loop
    self._actions = [*actions, checkpoint]
    self._checkpoint = checkpoint
    self._reporter = reporter
    self._stop_signal = wiring.stop_signal
    self._speed = wiring.speed
    self._wiring = wiring
    self._is_chief = wiring.task_info.is_chief
    self._num_workers = wiring.task_info.num_workers
    self._status = wiring.status
    # Unless an action handles it (a rollback), a log that is not finite
    # stops the run before any action runs.
    self._stop_on_divergence = not any(action.handles_divergence
                                       for action in self._actions)
    self._worker_sum = metric_reading.WorkerSum(wiring.strategy)
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
          total_steps=total_steps, task=self._wiring.task,
          workdir=self._wiring.workdir,
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
      self.first_step_seconds = speed_lib.seconds_since(
          self._wiring.started)
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
      if self._wiring.watchdog:  # After the loop and each action.
        self._wiring.watchdog.beat()
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
    restored = self._checkpoint.restore_weights()
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
    """Whether the action at `index` is due (again) after this loop."""
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

