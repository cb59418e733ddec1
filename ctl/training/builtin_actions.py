"""Built-in actions: early stopping, rollback of a diverging loss, a CSV
file of every logged value, and the profiler's start and stop.

Any task's run takes the first two from config fields
(`config.early_stopping`, `config.rollback`: `from_config`; `config.log_csv`
is a sink of ctl/training/report.py); a task's own `actions()`
can add them too, with other arguments.
"""

import math
from typing import Any

from absl import logging
import ml_collections
import tensorflow as tf

from ctl import actions
from ctl import config as config_lib
from ctl import errors
from ctl.checkpoints import best as best_lib
from ctl.runtime import workdir as workdir_lib
from ctl.training import failures
from ctl.training import report

class EarlyStopping(actions.Action):
  """Stops training cleanly (exit 0) once an eval metric has not improved
  by more than `min_delta` for `patience` evaluations in a row.

  Runs after each evaluation on every worker (the eval results are
  all-reduced, so every worker decides alike). Its best value and count
  are in every checkpoint: a resumed run stops at the same step.
  """

  when = actions.When(after_eval=True)
  on_every_worker = True

  def __init__(self, metric: str, mode: str = 'max', patience: int = 5,
               min_delta: float = 0.0):
    """Args: metric: an eval metric as logged ('accuracy'), or 'set/metric'
    for a task with several eval sets; mode: 'max' or 'min', which way is
    better; patience: evaluations without improvement before stopping;
    min_delta: the least change that counts as an improvement."""
    if mode not in config_lib.BEST_MODES:
      raise errors.ConfigError(
          f'EarlyStopping mode={mode!r}: use one of {config_lib.BEST_MODES}.')
    if patience < 1:
      raise errors.ConfigError(
          f'EarlyStopping patience={patience}: use 1 or more evaluations.')
    self._metric = metric
    self._mode = mode
    self._patience = patience
    self._min_delta = abs(min_delta)
    self._best = None  # (value, step)
    self._waited = 0

  def run(self, event: actions.Event) -> None:
    value = self._value(event.eval_results)
    if self._improves(value):
      self._best, self._waited = (value, event.step), 0
      return
    self._waited += 1
    if self._waited >= self._patience:
      best, step = self._best
      event.request_stop(
          f'early stopping: eval {self._metric} did not improve on {best:.6g} '
          f'(step {step}) by more than {self._min_delta:g} in '
          f'{self._patience} evaluation(s)')

  def _improves(self, value: float) -> bool:
    if math.isnan(value):
      return False
    if self._best is None:
      return True
    if self._mode == 'max':
      return value > self._best[0] + self._min_delta
    return value < self._best[0] - self._min_delta

  def _value(self, results) -> float:
    return best_lib.metric_value(results or {}, self._metric,
                                 'early_stopping.metric',
                                 "or '' to stop only at the end")

  def state(self) -> dict[str, Any]:
    return {'best': self._best, 'waited': self._waited}

  def restore(self, state: dict[str, Any]) -> None:
    self._best = tuple(state['best']) if state['best'] else None
    self._waited = state['waited']


class Rollback(actions.Action):
  """Rolls back a loss that is not finite or spikes: the weights of the
  latest checkpoint come back, and the data of the steps since is skipped.

  After every loop it reads the loop's mean `metric` (all-reduced: every
  worker decides alike). A value that is not finite, or above `factor`
  times the mean of the last `window` loops, is rolled back, at most
  `max_rollbacks` times in a run; the next one stops the run (exit 1, as
  without rollback). Its count and recent values are in every checkpoint,
  and a resumed run's loops end at the same steps (loop_plan.LoopPlan):
  it decides as an uninterrupted run would. A spike in one step is
  diluted in a long loop: `steps_per_loop` bounds what it sees.
  """

  when = actions.When(every_loop=True)
  on_every_worker = True
  handles_divergence = True

  def __init__(self, factor: float = 0.0, max_rollbacks: int = 3,
               window: int = 20, metric: str = 'loss'):
    """Args: factor: a spike is a value above factor times the recent
    mean (0: only non-finite values); max_rollbacks: how many in a run;
    window: the loops the recent mean is over; metric: a train log."""
    self._factor = factor
    self._max_rollbacks = max_rollbacks
    self._window = window
    self._metric = metric
    self._recent = []
    self._rollbacks = 0

  def run(self, event: actions.Event) -> None:
    value = event.loop_means.get(self._metric)
    if value is None:
      raise errors.ConfigError(
          f'Rollback watches train log {self._metric!r}, which this task\'s '
          f'train_step does not return; it returns {sorted(event.loop_means)}.')
    problem = self._problem(value)
    if problem is None:
      self._recent = (self._recent + [value])[-self._window:]
      return
    if self._rollbacks >= self._max_rollbacks:
      diverged = failures.divergence(event.loop_means, event.first_step,
                                     event.step)
      if diverged:
        raise diverged
      raise errors.CtlError(
          f'The training {self._metric} {problem} after step {event.step}, '
          f'and the run was rolled back {self._rollbacks} time(s) already '
          '(config.rollback.max_rollbacks). Lower the learning rate.')
    self._rollbacks += 1
    event.request_rollback(
        f'the training {self._metric} {problem} (rollback '
        f'{self._rollbacks} of {self._max_rollbacks})')

  def _problem(self, value: float) -> str | None:
    """Why value is rolled back; None when it is not."""
    if not math.isfinite(value):
      return f'is {value}'
    if self._factor and len(self._recent) >= 3:
      mean = sum(self._recent) / len(self._recent)
      if value > self._factor * mean:
        return (f'is {value:.4g}, over {self._factor:g} times its recent '
                f'mean {mean:.4g}')
    return None

  def state(self) -> dict[str, Any]:
    return {'recent': self._recent, 'rollbacks': self._rollbacks}

  def restore(self, state: dict[str, Any]) -> None:
    self._recent = list(state['recent'])
    self._rollbacks = state['rollbacks']


class CsvLogger(report.LoggedValues):
  """Appends every logged value to a CSV file, one `step,name,value` row
  each (ctl/metric_writers/csv_file.py: `train/loss`, `eval/accuracy`,
  `workers/1/input_wait_ms`); on the chief. config.log_csv writes
  workdir/metrics.csv so; this action writes another file. Its row count
  is in every checkpoint: a resumed run first drops the rows logged after
  the checkpoint it resumes from, so no step appears twice.
  """

  name = 'CsvLogger'
  when = actions.When(after_log=True, after_eval=True)
  on_every_worker = False

  def __init__(self, path: str):
    from ctl.metric_writers import csv_file  # pylint: disable=g-import-not-at-top
    self._csv = csv_file.CsvWriter(path)
    super().__init__(self._csv)

  def state(self) -> dict[str, Any]:
    return self._csv.state()

  def restore(self, state: dict[str, Any]) -> None:
    self._csv.restore(state)


def from_config(config: ml_collections.ConfigDict) -> list[actions.Action]:
  """The built-in actions that config asks for."""
  built = []
  stopping = config.early_stopping
  if stopping.metric:
    built.append(EarlyStopping(stopping.metric, stopping.mode,
                               stopping.patience, stopping.min_delta))
  if config.rollback.max_rollbacks:
    built.append(Rollback(config.rollback.factor,
                          config.rollback.max_rollbacks,
                          config.rollback.window))
  return built


def profile_actions(config: ml_collections.ConfigDict,
                    workdir: str) -> list[actions.Action]:
  """Start and stop a profiler trace around config.num_steps steps."""
  if not config.num_steps:
    return []
  # The first step traces the functions: a trace starts after it at least.
  start = max(config.start_step, 1)
  profiler = _Profiler(workdir_lib.summary_dir(workdir, 'train'), start,
                       start + config.num_steps)
  # One-off: loops end at these two steps on every worker and nowhere else
  # for them; the trace covers the steps in between, on the chief alone.
  # It also stops at an earlier end of training.
  return [actions.Call('profile start', actions.When(at_steps=start),
                       profiler.begin, on_every_worker=False),
          actions.Call('profile stop',
                       actions.When(at_steps=profiler.end, at_end=True),
                       profiler.finish, on_every_worker=False)]


class _Profiler:
  """A TensorBoard profiler trace of the steps after `start` to `end`."""

  def __init__(self, logdir: str, start: int, end: int):
    self._logdir = logdir
    self._start = start
    self.end = end
    self._tracing = False

  def begin(self, event: actions.Event) -> None:
    """Starts the trace after step `start` (none after the last step)."""
    if not event.end:
      tf.profiler.experimental.start(self._logdir)
      self._tracing = True

  def finish(self, event: actions.Event) -> None:
    """Stops and writes the trace, if this process started it."""
    if self._tracing:
      self._tracing = False
      tf.profiler.experimental.stop()
      logging.info('Profiled steps %d..%d into %s', self._start + 1,
                   event.step, self._logdir)
    elif event.step == self.end:
      # A run resumed inside the steps: the trace died with the process.
      logging.warning(
          'Profiled nothing: the trace of steps %d..%d started in a process '
          'that stopped before its end. Set a later config.profile.start_step '
          'to profile again.', self._start + 1, self.end)
