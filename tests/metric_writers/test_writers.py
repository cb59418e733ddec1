"""The metric writers as a run wires them: a sink of a task's own is one
class and gets what metrics.csv gets; a worker other than the chief gets
writers that write nothing but its log lines."""

import csv

from ctl import actions
from ctl import metric_writers
from ctl.metric_writers import log_line
from ctl.training import run
from ctl.training import report
import helpers
import user_modules

NOISY = helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py'


def _csv_rows(workdir) -> list[tuple[str, str, str]]:
  with open(workdir / 'metrics.csv', newline='') as file:
    return [(row['step'], row['name'], row['value'])
            for row in csv.DictReader(file)]


def test_a_sink_of_one_class_gets_every_value_metrics_csv_gets(tmp_path):
  # Loops of 2 steps, a report every 4, a stop after step 6 (an action's):
  # train values at 4 and 6, the final evaluation's at 6, then the end.
  user_modules.WritesToAList.made.clear()
  config = helpers.override(
      helpers.load_config_file(NOISY, 'WritesToAList'), deterministic=True,
      steps_per_loop=2, log_csv=True, **{'intervals.log_steps': 4})
  run.train_and_evaluate(config, str(tmp_path))
  [writer] = user_modules.WritesToAList.made  # On the chief, made once.
  rows = [(str(step), name, str(value)) for step, name, value in writer.rows]
  assert rows == _csv_rows(tmp_path)
  names = {name for _, name, _ in rows}
  assert {'train/loss', 'train/steps_counted', 'eval/mae'} <= names
  assert writer.closed  # At the end of training.


class _NotOnThisWorker:
  """A task whose sinks must not be made: this is not the chief."""

  def metric_writers(self):
    raise AssertionError('metric_writers() called on a worker other than '
                         'the chief')


def test_a_worker_other_than_the_chief_writes_only_its_log_lines(
    tmp_path, caplog):
  # metrics.csv and an MLflow server that is not there: nothing is made.
  config = helpers.override(
      helpers.load_config_file(NOISY), log_csv=True,
      **{'mlflow.tracking_uri': 'http://127.0.0.1:9'})
  workdir = tmp_path / 'workdir'
  logged = report.logged_values(config, str(workdir), False,
                                     _NotOnThisWorker())
  assert type(logged.writer) is metric_writers.NullWriter
  summaries = report.train_summaries(str(workdir), False)
  assert type(summaries) is metric_writers.NullWriter
  evaluation = report.eval_writer(str(workdir / 'eval'), '', False)
  assert type(evaluation) is log_line.LogLineWriter

  caplog.set_level('INFO')
  event = actions.Event(
      step=4, steps_per_epoch=16, total_steps=4, task=None,
      workdir=str(workdir), is_chief=False, train_logs={'loss': 0.5},
      eval_results={'mae': 0.25})
  event.logged = event.evaluated = True
  summaries.write_scalars(4, {'loss': 0.5})
  metric_writers.write_results(evaluation, 4, {'mae': 0.25})
  logged.run(event)  # The end: closes its writer too.
  summaries.close()
  evaluation.close()
  assert not workdir.exists()
  assert 'eval at step 4: mae 0.25' in caplog.text
