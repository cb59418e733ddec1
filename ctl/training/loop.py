"""The Python loop around train_loop: trains a loop of steps, then runs the
work due at its last step, and again.

What each piece of work does is an action's (ctl/actions.py); when it is
due, the schedule's (ctl/training/loop_plan.py), the one place that
decides. Loops end at every step where some action is due by its step or
epoch count or once (`When.at_steps`), so that logs, summaries,
evaluations, checkpoints and a task's own actions happen at exact steps,
the same on every worker (metric reads and checkpoint saves are
collectives under MultiWorkerMirroredStrategy). No action is special: the
checkpoint is the last of the list, due by its intervals, at the end, and
on request (SIGTERM, its time interval, or an action's); the report's log
line and the evaluation's results are handed to the work that follows
them.

The loop calls down only: it is handed the run's checkpoint
(ctl/checkpoints/manager.TrainingCheckpoint), which it saves as its last
action and whose weights it puts back on an action's rollback.
"""

from collections.abc import Callable, Sequence
import dataclasses
import math
import time
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf

from ctl import actions as actions_lib
from ctl import errors
from ctl.checkpoints import manager as checkpoint_manager
from ctl.training import failures
from ctl.training import job as job_lib
from ctl.training import loop_plan
from ctl.training import task_calls
from ctl.training import report as report_lib
from ctl.training import state as state_lib

# The loop arguments kept as tensors (TrainLoop._int32_tensor).
_MAX_TENSORS = 256


@dataclasses.dataclass(frozen=True)
class Stopped:
  """Training stopped before its last step because an action asked."""

  step: int
  reason: str


@dataclasses.dataclass(frozen=True)
class Work:
  """What runs after each loop: the actions that are due, in their order,
  then the checkpoint.

  Attributes:
    actions: the report and the evaluation among them.
    report: gets each loop's logs; its log line's values go to the work
      after it (When.after_log).
    checkpoint: saved as the last action; rolled back to (the weights
      only) on an action's request.
    evaluation: its results go to the work after it (When.after_eval);
      None for none.
  """

  actions: Sequence[actions_lib.Action]
  report: report_lib.Reporter
  checkpoint: checkpoint_manager.TrainingCheckpoint
  evaluation: actions_lib.Action | None = None


@dataclasses.dataclass(frozen=True)
class Wiring:
  """What the loop reads and tells, besides its steps and work.

  Attributes:
    length: the run's batch sizes and step counts.
    steps_per_loop: the most steps in one loop.
    task: the ctl.Task (handed to the actions in each Event).
    workdir: the run's workdir.
    job: the strategy, this worker's role, its watchdog (told of each loop
      and action) and worker status (times each loop and action).
    process: SIGTERM's request to stop; the run's start-up, timed to the
      end of its first loop.
    speed: times the loops.
  """

  length: state_lib.TrainingLength
  steps_per_loop: int
  task: Any
  workdir: str
  job: job_lib.Job
  process: job_lib.Process
  speed: report_lib.SpeedMeter


@dataclasses.dataclass(frozen=True)
class _Trained:
  """What a loop of steps gave: its mean logs, whether some worker asked
  to stop (SIGTERM), the work some worker's clock says is due."""

  logs: dict[str, float]
  preempted: bool
  timed: set[int]


class TrainLoop:
  """Runs planned loops of steps; after each, the work due, in its order,
  the checkpoint last."""

  def __init__(self, runner, work: Work, wiring: Wiring,
               clock: Callable[[], float] = time.monotonic):
    """Args as named; runner: a ctl.training.steps.StepRunner (or what
    has its train_loop); clock: the actions' clocks' (When.secs)."""
    self._runner, self._work, self._wiring = runner, work, wiring
    self._actions = [*work.actions, work.checkpoint]
    self._schedule = loop_plan.Schedule(
        [action.when for action in self._actions],
        steps_per_epoch=wiring.length.steps_per_epoch,
        total_steps=wiring.length.total_steps,
        report=self._actions.index(work.report),
        evaluation=(None if work.evaluation is None else
                    self._actions.index(work.evaluation)), clock=clock)
    self._role = wiring.job.role
    # Unless an action handles it (a rollback), a log that is not finite
    # stops the run before any action runs.
    self._stop_on_divergence = not any(action.handles_divergence
                                       for action in self._actions)
    self._worker_sum = task_calls.WorkerSum(wiring.job.strategy)
    self.eval_results = None  # The latest evaluation's.
    self.first_step_seconds = None
    self._tensors = {}  # {value: int32 tensor}, see _int32_tensor.

  def plan(self, step: int) -> loop_plan.LoopPlan:
    """The loops from `step` to the end (Schedule.plan)."""
    return self._schedule.plan(step, self._wiring.steps_per_loop)

  def run(self, iterator, loops: loop_plan.LoopPlan) -> Stopped | None:
    """Runs the planned loops and the work due after each.

    Returns:
      Stopped when an action stopped training early; None at the end.

    Raises:
      Preempted: after saving, when some worker received SIGTERM.
      CtlError: when a log is not finite (nothing saved after the loop
        before).
    """
    self._log_start(loops.start)
    self._wiring.process.start_up.end('building')
    for first_step, step in loops:
      trained = self._train(iterator, first_step, step)
      event = self._event(first_step, step, trained.logs)
      if trained.preempted:
        event.request_checkpoint()
      self._run_due(event, self._schedule.after_loop(
          step, tuple(event.requests), trained.timed))
      # An action's stop first: its checkpoint says training ended there.
      stopped = self._stopped(event)
      if stopped:
        return stopped
      if trained.preempted and step < event.total_steps:
        raise self._preempted(step)
    return None

  def _log_start(self, step: int) -> None:
    """Logs where training starts and ends."""
    length = self._wiring.length
    logging.info('Training from step %d to %d (epoch %d of %d, %d steps each)',
                 step, length.total_steps,
                 step // length.steps_per_epoch + 1, length.num_epochs,
                 length.steps_per_epoch)

  def _train(self, iterator, first_step: int, step: int) -> _Trained:
    """One loop of steps, from first_step to step; its logs go to the
    report."""
    num_steps = step - first_step
    requests = self._int32_tensor((self._wiring.process.stop_signal.requested,
                                   *self._schedule.clocks_due()))
    self._wiring.speed.start()
    with self._wiring.job.worker_status.phase('training', step):
      outputs = self._runner.train_loop(
          iterator, self._int32_tensor(num_steps), requests,
          read_metrics=self._schedule.report_due_at(step))
      logs = {name: float(value) for name, value in outputs['logs'].items()}
    loop_logs = {name: float(value)
                 for name, value in outputs['loop_logs'].items()}
    agreed = (outputs['requests'].numpy() > 0).tolist()
    self._time_first_loop(first_step, step)
    # Checked here, cheaply; failures.py says what a divergence means.
    if self._stop_on_divergence and not all(map(math.isfinite,
                                                logs.values())):
      raise failures.divergence(logs, first_step, step)
    self._work.report.add(logs, num_steps, loop_logs, outputs.get('metrics'))
    return _Trained(logs, agreed[0], self._schedule.timed(agreed[1:]))

  def _time_first_loop(self, first_step: int, step: int) -> None:
    """Times the loop; logs when the process's first loop is done."""
    if not self._wiring.speed.stop(step - first_step):
      return
    start_up = self._wiring.process.start_up
    start_up.end('first_loop')
    self.first_step_seconds = sum(start_up.seconds().values())
    # A resumed run's first loop is as long as an uninterrupted run's.
    logging.info('%s done %.1f s after the run started',
                 'First step' if step - first_step == 1 else
                 f'First loop (steps {first_step + 1}..{step})',
                 self.first_step_seconds)

  def timing(self) -> dict[str, Any]:
    """This run's start-up and steady speed, for results.json (a resumed
    run's earlier runs are not in it)."""
    started = self.first_step_seconds is not None
    return {
        'first_step_seconds': self.first_step_seconds,
        'start_up_seconds': (self._wiring.process.start_up.seconds()
                             if started else None),
        'steps_per_second': self._wiring.speed.steady_steps_per_second(),
    }

  def _int32_tensor(self, value: int | tuple[bool, ...]) -> tf.Tensor:
    """value as an int32 tensor, made once: a loop's arguments take few
    values (its length, the request flags), and making them anew cost each
    loop of the MLP 0.1-0.17 ms (BENCHMARKS.md, "Per-loop costs")."""
    if value not in self._tensors:
      if len(self._tensors) >= _MAX_TENSORS:  # Memory stays bounded.
        self._tensors.clear()
      self._tensors[value] = tf.constant(value, tf.int32)
    return self._tensors[value]

  def _event(self, first_step: int, step: int,
             logs: dict[str, float]) -> actions_lib.Event:
    """What the actions see after the loop from first_step to step."""
    length = self._wiring.length
    return actions_lib.Event(
        step=step, steps_per_epoch=length.steps_per_epoch,
        total_steps=length.total_steps, task=self._wiring.task,
        workdir=self._wiring.workdir, is_chief=self._role.is_chief,
        train_logs=self._work.report.latest, eval_results=self.eval_results,
        loop_means=logs, first_step=first_step)

  def _run_due(self, event: actions_lib.Event, due: loop_plan.Due) -> None:
    """Runs the work due, lowest first; a log line's values and an
    evaluation's results go into the event for the work they make due,
    a request makes its work due, a rollback is done at once."""
    watchdog = self._wiring.job.watchdog  # None for one worker.
    for index in due:
      if watchdog:
        watchdog.beat()  # After the loop and each action.
      requested = set(event.requests)
      results = self._run_action(self._actions[index], event)
      if results is not None and index == self._schedule.report:
        event.train_logs, event.logged = results, True
      if results is not None and index == self._schedule.evaluation:
        event.eval_results, event.evaluated = results, True
      due.gave(index, results)
      new = [name for name in event.requests if name not in requested]
      due.requested(new)
      if 'rollback' in new:
        self._roll_back(event)
    if watchdog:
      watchdog.beat()
    self.eval_results = event.eval_results

  def _run_action(self, action: actions_lib.Action,
                  event: actions_lib.Event) -> Any:
    """Runs one action; what it gave (a report's or an evaluation's
    results, which run on every worker; None for a chief-only one).

    A chief-only action's requests count once the workers agreed on them
    (one small all-reduce): every worker knows which actions are due, so
    every worker takes part.
    """
    status = self._wiring.job.worker_status
    if action.on_every_worker or self._role.num_workers == 1:
      with status.phase(action.name):
        return action.run(event)
    before = dict(event.requests)
    if self._role.is_chief:
      with status.phase(action.name):
        action.run(event)
    made = {name: reason for name, reason in event.requests.items()
            if name not in before}
    event.requests = {**before, **self._agree(made)}
    return None

  def _roll_back(self, event: actions_lib.Event) -> None:
    """Puts back the latest checkpoint's weights; the data goes on."""
    restored = self._work.checkpoint.restore_weights()
    self._work.report.restored()
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

  def _stopped(self, event: actions_lib.Event) -> Stopped | None:
    """An action's stop before the last step, logged; else None."""
    if 'stop' not in event.requests or event.step >= event.total_steps:
      return None
    reason = event.requests['stop']
    logging.info('Stopped at step %d of %d: %s', event.step,
                 event.total_steps, reason)
    return Stopped(event.step, reason)

  def _preempted(self, step: int) -> errors.Preempted:
    """What SIGTERM's stop after `step` (a checkpoint saved) raises."""
    total_steps = self._wiring.length.total_steps
    return errors.Preempted(
        f'Stopped by {self._wiring.process.stop_signal.received or "SIGTERM"} '
        f'after step {step} of {total_steps}, with a checkpoint of step '
        f'{step}. Run the same command again to resume from it.')
