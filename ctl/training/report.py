"""What a run reports, and where to: the report action (the log line and
the train summaries, every `log_steps` and `summary_steps`, at each
epoch's end and at the end), the speed it reports (`SpeedMeter`: loop
timing, steady speed, ETA), and the run's writers.

Which sinks a process writes to is decided once per run, here: the chief
gets them all, every other worker its log lines and a NullWriter for the
rest.

    train summaries    TensorBoard's train/ run, at summary_steps (Reporter,
                       train_summaries)
    train log line     the Reporter's, every log_steps, every worker
    eval writers       an eval set's log line, and TensorBoard's eval/<set>/
                       (eval_writer)
    logged values      every logged value, as metrics.csv holds them, to
                       metrics.csv (config.log_csv), MLflow
                       (config.mlflow.tracking_uri) and the task's own sinks
                       (Task.metric_writers()): the LoggedValues action
"""

from collections.abc import Sequence
import os
import time
from typing import Any

import ml_collections

from ctl import actions as actions_lib
from ctl import metric_writers
from ctl import task as task_lib
from ctl.checkpoints import best as best_lib
from ctl.metric_writers import log_line
from ctl.metric_writers import tensorboard
from ctl.runtime import workdir as workdir_lib
from ctl.training import task_calls
from ctl.training import state as state_lib


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
               metrics: task_calls.MetricReader,
               writer: metric_writers.MetricWriter,
               speed: 'SpeedMeter',
               when: actions_lib.When, summary_when: actions_lib.When):
    """Args as named; writer: the train summaries' (train_summaries);
    when: the report action's, summary_when: the summaries' (a report
    writes them when both are due)."""
    self.when = when
    self._length = length
    self._metrics = metrics
    self._writer = writer
    self._speed = speed
    self._summary_when = summary_when
    self._line = log_line.train_line(
        length, lambda step: speed.eta_seconds(step, length.total_steps))
    self._sums: dict[str, float] = {}
    self._steps = 0
    self._latest: dict[str, float] = {}  # The latest loop's loop_logs.
    self._metric_results = None  # Read by the loop, for the next report.
    self.latest: dict[str, float] = {}  # The latest report's values.

  def add(self, logs: dict[str, float], num_steps: int,
          loop_logs: dict[str, float], metric_results=None) -> None:
    """Adds a loop's mean logs; keeps its loop_logs, the latest, and the
    train metrics' results if the loop read them (then reset them)."""
    for name, value in logs.items():
      self._sums[name] = self._sums.get(name, 0.0) + value * num_steps
    self._steps += num_steps
    self._latest = loop_logs
    if metric_results is not None:
      self._metric_results = task_calls.as_python(metric_results)

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

  def run(self, event: actions_lib.Event) -> dict[str, float] | None:
    """As an action: the report; its values (the loop hands them to the
    work after a log line), or None when it wrote no line."""
    return self.report(event)

  def report(self, event: actions_lib.Event) -> dict[str, float] | None:
    """Logs (and at summary steps summarises) everything since the last;
    returns the values logged, or None when there was nothing to log."""
    if not self._steps:
      # A rollback at this step left no step to report (its warning says
      # so): no log line; the actions after one do not run.
      return None
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
      self._writer.write_scalars(step, scalars)
    self.latest = scalars
    self._line.write_scalars(step, scalars)
    if event.end:
      self._line.flush()  # A live line on a terminal scrolls at the end.
    return scalars


class SpeedMeter:
  """Times train loops; the first (it traces the functions) is left out."""

  def __init__(self, clock=time.monotonic):
    self._clock = clock
    self._loop_started = 0.0
    self._steps = 0  # Since the last steps_per_second().
    self._seconds = 0.0
    self._loop_ends = []  # (steps trained, time) after each loop.
    self._first = None  # (steps, seconds) of the first loop, until read.

  def start(self) -> None:
    self._loop_started = self._clock()

  def stop(self, num_steps: int) -> bool:
    """Records a loop of num_steps steps; returns whether it was the first."""
    now = self._clock()
    first = not self._loop_ends
    trained = num_steps + (self._loop_ends[-1][0] if self._loop_ends else 0)
    self._loop_ends.append((trained, now))
    if first:
      self._first = (num_steps, now - self._loop_started)
    else:
      self._steps += num_steps
      self._seconds += now - self._loop_started
    return first

  def steps_per_second(self) -> float | None:
    """Training speed since the last call, inside train loops only; the
    first loop's (its tracing included) when it is all there was (a
    resumed run's first report may follow its first loop alone)."""
    steps, seconds = (self._steps, self._seconds) if self._seconds else (
        self._first or (0, 0.0))
    self._steps, self._seconds, self._first = 0, 0.0, None
    return steps / seconds if seconds else None

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
    (first_steps, first_time), (steps, _) = (self._loop_ends[0],
                                             self._loop_ends[-1])
    pace = (self._clock() - first_time) / (steps - first_steps)
    return pace * (total_steps - step)


def train_summaries(workdir: str,
                    is_chief: bool) -> metric_writers.MetricWriter:
  """The train summaries: TensorBoard's train/ run on the chief."""
  if not is_chief:
    return metric_writers.NullWriter()
  return tensorboard.TensorBoardWriter(workdir_lib.summary_dir(workdir,
                                                               'train'))


def eval_writer(eval_dir: str, set_name: str,
                is_chief: bool) -> metric_writers.MetricWriter:
  """An eval set's writer: its log line on every worker, and on the chief
  TensorBoard's eval/ run (eval/<set>/ for one of several sets)."""
  line = log_line.eval_line(set_name)
  if not is_chief:
    return line
  return metric_writers.MultiWriter([
      tensorboard.TensorBoardWriter(os.path.join(eval_dir, set_name)), line])


class LoggedValues(actions_lib.Action):
  """Writes every logged value to a writer, as metrics.csv rows name them:
  `train/<name>` after each log line, `workers/<i>/<phase>_ms` under their
  reports' steps (several workers: Event.worker_timings), `eval/<name>`
  (`eval/<set>/<name>`) after each evaluation; flushes after each, and
  closes it at the end of training.

  Runs on every worker (it requests nothing): a worker's writer is what
  logged_values made it, a NullWriter on all but the chief.
  """

  name = 'ctl.logged-values'
  when = actions_lib.When(after_log=True, after_eval=True, at_end=True)
  on_every_worker = True

  def __init__(self, writer: metric_writers.MetricWriter,
               stateful_sinks: Sequence = (), mlflow=None):
    """Args: writer: where the values go; stateful_sinks: its sinks whose state
    the checkpoint keeps (each with a name, state(), restore()); mlflow:
    its MlflowWriter, if any (send_left_over)."""
    self.writer = writer
    self.stateful_sinks = list(stateful_sinks)
    self._mlflow = mlflow
    self._written = (-1, -1)  # The steps of the latest train and eval writes.
    self._closed = False

  def run(self, event: actions_lib.Event) -> None:
    if event.logged and self._written[0] != event.step:
      self.writer.write_scalars(event.step, {
          f'train/{name}': value for name, value in event.train_logs.items()})
      # Each worker's timings, under the steps of their reports (earlier).
      for step, timings in event.worker_timings.items():
        self.writer.write_scalars(step, timings)
    if event.evaluated and self._written[1] != event.step:
      self.writer.write_scalars(event.step, {
          f'eval/{name}': value for name, value in
          best_lib.flat_metrics(event.eval_results).items()})
    self._written = (event.step if event.logged else self._written[0],
                     event.step if event.evaluated else self._written[1])
    self.writer.flush()
    if event.end and not self._closed:
      self._closed = True
      self.writer.close()

  def send_left_over(self) -> None:
    """Training had finished before this run: MLflow gets what it was
    left without (its server was down), and its run is finished."""
    if self._mlflow is not None:
      self._mlflow.send_left_over()


def logged_values(config: ml_collections.ConfigDict, workdir: str,
                  is_chief: bool, task: task_lib.Task) -> LoggedValues:
  """The run's LoggedValues action: on the chief to metrics.csv, MLflow and
  the task's own sinks, as config and the task ask; to nothing elsewhere
  (every worker keeps metrics.csv's row count, the chief's is saved)."""
  # The sinks' modules are imported only where a config asks for them.
  # pylint: disable=g-import-not-at-top
  csv = None
  if config.log_csv:
    from ctl.metric_writers import csv_file
    csv = csv_file.CsvWriter(workdir_lib.metrics_csv_path(workdir))
  states = [csv] if csv else []
  if not is_chief:
    return LoggedValues(metric_writers.NullWriter(), states)
  mlflow = None
  if config.mlflow.tracking_uri:
    from ctl.metric_writers import mlflow_writer
    mlflow = mlflow_writer.MlflowWriter(config, workdir)
  sinks = [sink for sink in (csv, mlflow) if sink is not None]
  return LoggedValues(
      metric_writers.MultiWriter([*sinks, *task.metric_writers()]), states,
      mlflow)
