"""The Python loop around train_loop: runs loops of steps and the periodic
actions due after each.

Periodic work is a list of `Action`s, each saying *when* (`periodic.Every`:
every N steps, at epoch ends) apart from *what* (a callable of the step). Loops end at every
step where some action is due, so that logs, summaries, evaluations and
checkpoints happen at exact steps, the same on every worker (metric reads
and checkpoint saves are collectives under MultiWorkerMirroredStrategy).
"""

from collections.abc import Callable, Sequence
import dataclasses
import datetime
import math

from absl import logging
import tensorflow as tf

from ctl import errors
from ctl.runtime import periodic
from ctl.runtime import preemption
from ctl.runtime import summaries
from ctl.training import metric_reading
from ctl.training import speed as speed_lib
from ctl.training import state as state_lib


@dataclasses.dataclass(frozen=True)
class Action:
  """Periodic work: when it is due, and what it does at a step."""

  name: str
  when: periodic.Every
  what: Callable[[int], None]


class TrainLoop:
  """Runs planned loops of steps; after each, the actions due and the checks.

  Checkpoints are an action too, also due after SIGTERM (then training
  stops), when `checkpoint_secs` passed on some worker's clock, and at the
  end: those requests are agreed inside train_loop.
  """

  def __init__(self, *, runner, length: state_lib.TrainingLength,
               steps_per_loop: int, actions: Sequence[Action],
               checkpoint: Action, checkpoint_clock: periodic.Periodic,
               stop_signal: preemption.StopSignal, speed: speed_lib.SpeedMeter,
               on_logs: Callable[[dict[str, float], int, dict[str, float]],
                                 None],
               on_first_step: Callable[[], None]):
    """Args as named.

    Args:
      runner: a ctl.training.steps.StepRunner.
      on_logs: receives each loop's mean logs, its number of steps and its
        loop_logs.
      on_first_step: called once the first step is done.
    """
    self._runner = runner
    self._length = length
    self._steps_per_loop = steps_per_loop
    self._actions = list(actions)
    self._checkpoint = checkpoint
    self._checkpoint_clock = checkpoint_clock
    self._stop_signal = stop_signal
    self._speed = speed
    self._on_logs = on_logs
    self._on_first_step = on_first_step

  def plan(self, step: int) -> periodic.LoopPlan:
    """The loops from `step` to the end: they end where some action is due
    by its step count."""
    every = sorted({every for action in (*self._actions, self._checkpoint)
                    for every in action.when.steps if every})
    return periodic.LoopPlan(step, self._length.total_steps,
                             self._length.steps_per_epoch,
                             self._steps_per_loop, tuple(every))

  def run(self, iterator, loops: periodic.LoopPlan) -> None:
    """Runs the planned loops and the actions due after each.

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
      num_steps = step - previous_step
      requests = tf.constant([self._stop_signal.requested,
                              self._checkpoint_clock.due_by_time()], tf.int32)
      self._speed.start()
      outputs = self._runner.train_loop(iterator, tf.constant(num_steps),
                                        requests)
      logs = {name: float(value) for name, value in outputs['logs'].items()}
      loop_logs = {name: float(value)
                   for name, value in outputs['loop_logs'].items()}
      stop, save_now = (outputs['requests'].numpy() > 0).tolist()
      if self._speed.stop(num_steps):
        self._on_first_step()
      _check_finite(logs, previous_step, step)
      self._on_logs(logs, num_steps, loop_logs)
      end_of_epoch = (step % self._length.steps_per_epoch == 0 or
                      step == total_steps)
      for action in self._actions:
        if action.when.due(step, end_of_epoch):
          action.what(step)
      if (save_now or stop or step == total_steps or
          self._checkpoint.when.due(step, end_of_epoch)):
        self._checkpoint.what(step)
        self._checkpoint_clock.done()
      if stop and step < total_steps:
        raise errors.Preempted(
            f'Stopped by {self._stop_signal.received or "SIGTERM"} after step '
            f'{step} of {total_steps}, with a '
            f'checkpoint of step {step}. Run the same command again to '
            'resume from it.')


class Reporter:
  """The report action: logs and summarises the task's logs and metrics.

  The task's logs are averaged over the loops since the last report; the
  train metrics are read (on every worker: a collective) and reset.
  """

  def __init__(self, *, length: state_lib.TrainingLength,
               metrics: metric_reading.MetricReader,
               writer: summaries.MetricWriter, speed: speed_lib.SpeedMeter,
               summary_every: periodic.Every):
    self._length = length
    self._metrics = metrics
    self._writer = writer
    self._speed = speed
    self._summary_every = summary_every
    self._sums: dict[str, float] = {}
    self._steps = 0
    self._latest: dict[str, float] = {}

  def add(self, logs: dict[str, float], num_steps: int,
          loop_logs: dict[str, float]) -> None:
    """Adds a loop's mean logs; keeps its loop_logs, the latest."""
    for name, value in logs.items():
      self._sums[name] = self._sums.get(name, 0.0) + value * num_steps
    self._steps += num_steps
    self._latest = loop_logs

  def report(self, step: int) -> None:
    """Logs (and at summary steps summarises) everything since the last."""
    scalars = {name: total / self._steps for name, total in self._sums.items()
               } if self._steps else {}
    self._sums, self._steps = {}, 0
    scalars.update(self._latest)
    scalars.update(self._metrics.read_and_reset())
    steps_per_second = self._speed.steps_per_second()
    if steps_per_second:
      scalars['steps_per_second'] = steps_per_second
      scalars['examples_per_second'] = (
          steps_per_second * self._length.global_batch_size)
    end_of_epoch = (step % self._length.steps_per_epoch == 0 or
                    step == self._length.total_steps)
    if self._summary_every.due(step, end_of_epoch):
      self._writer.write(step, scalars)
    # Counted from 1: "epoch 1, step 22 of 22" is the end of the first epoch.
    epoch = -(-step // self._length.steps_per_epoch)
    step_in_epoch = step - (epoch - 1) * self._length.steps_per_epoch
    eta = self._speed.eta_seconds(step, self._length.total_steps)
    logging.info(
        'step %d/%d epoch %d/%d (step %d of %d) | %s | ETA %s', step,
        self._length.total_steps, epoch, self._length.num_epochs,
        step_in_epoch, self._length.steps_per_epoch,
        summaries.format_scalars(scalars),
        datetime.timedelta(seconds=round(eta)) if eta is not None else '?')


def _check_finite(logs: dict[str, float], previous_step: int,
                  step: int) -> None:
  """Raises CtlError naming the first log that is not finite."""
  for name, value in logs.items():
    if not math.isfinite(value):
      where = (f'at step {step}' if step - previous_step == 1 else
               f'in steps {previous_step + 1}..{step}')
      raise errors.CtlError(
          f'The training {name} is {value} after step {step}: it diverged '
          f'{where}. Nothing was saved after step {previous_step}. Lower the '
          'learning rate, or run with --config.steps_per_loop=1 to find the '
          'exact step.')
