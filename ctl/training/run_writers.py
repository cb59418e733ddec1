"""Which sinks a process writes to, decided once per run: the chief gets
them all, every other worker its log lines and a NullWriter for the rest.

    train summaries    TensorBoard's train/ run, at summary_steps (Reporter)
    train log line     ctl/training/report.py's, every log_steps, every worker
    eval writers       an eval set's log line, and TensorBoard's eval/<set>/
    logged values      every logged value, as metrics.csv holds them, to
                       metrics.csv (config.log_csv), MLflow
                       (config.mlflow.tracking_uri) and the task's own sinks
                       (Task.metric_writers()): the LoggedValues action
"""

from collections.abc import Sequence
import os

import ml_collections

from ctl import actions
from ctl import metric_writers
from ctl import task as task_lib
from ctl.checkpoints import best as best_lib
from ctl.metric_writers import log_line
from ctl.metric_writers import tensorboard
from ctl.runtime import workdir as workdir_lib


def train_summaries(workdir: str, is_chief: bool) -> metric_writers.MetricWriter:
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


class LoggedValues(actions.Action):
  """Writes every logged value to a writer, as metrics.csv rows name them:
  `train/<name>` after each log line, `workers/<i>/<phase>_ms` under their
  reports' steps (several workers: Event.worker_timings), `eval/<name>`
  (`eval/<set>/<name>`) after each evaluation; flushes after each, and
  closes it at the end of training.

  Runs on every worker (it requests nothing): a worker's writer is what
  run_writers made it, a NullWriter on all but the chief.
  """

  name = 'ctl.logged-values'
  when = actions.When(after_log=True, after_eval=True, at_end=True)
  on_every_worker = True

  def __init__(self, writer: metric_writers.MetricWriter,
               states: Sequence = (), mlflow=None):
    """Args: writer: where the values go; states: its sinks whose state
    the checkpoint keeps (each with a name, state(), restore()); mlflow:
    its MlflowWriter, if any (send_left_over)."""
    self.writer = writer
    self.states = list(states)
    self._mlflow = mlflow
    self._written = (-1, -1)  # The steps of the latest train and eval writes.
    self._closed = False

  def run(self, event: actions.Event) -> None:
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
