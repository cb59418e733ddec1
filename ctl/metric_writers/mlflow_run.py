"""MLflow tracking (the optional extra `ctl[mlflow]`): one MLflow run per
ctl run, continued when the job resumes; a sweep's trials as child runs.

    --config.mlflow.tracking_uri=http://localhost:5000

The chief logs the config as params when the run starts, the logged train
values (`train/<name>`) and eval results (`eval/<name>`, or
`eval/<set>/<name>`) at their steps, the export as artifacts under
`export/`, and marks the run FINISHED when training ends. The MLflow run's
id is kept in workdir/mlflow.json: a resumed job continues that run, and
does not log again the steps it had logged before it stopped (a resumed
run computes them anew, bit for bit).

Here: the tracking client, the MLflow run of a workdir, its params, the
export and a sweep's parent run. The values are sent by a metric writer
(ctl/metric_writers/mlflow_writer.py): training never waits on the server.
"""

from collections.abc import Mapping
import os
import urllib.parse

from absl import logging
import ml_collections

from ctl import errors
from ctl import storage
from ctl.runtime import workdir as workdir_lib

PARENT_TAG = 'mlflow.parentRunId'  # MLflow's own: runs nest under it.
_MAX_PARAM_CHARS = 6000  # MLflow's limit on a param's value.


def enabled(config: ml_collections.ConfigDict) -> bool:
  """Whether config logs to MLflow (a tracking URI is set)."""
  return bool(config.mlflow.tracking_uri)


def client(tracking_uri: str):
  """An MlflowClient with bounded waits: a few retries, 30 s a request."""
  # MLflow's defaults retry for minutes; a training job must not hang on it.
  os.environ.setdefault('MLFLOW_HTTP_REQUEST_MAX_RETRIES', '3')
  os.environ.setdefault('MLFLOW_HTTP_REQUEST_TIMEOUT', '30')
  try:
    from mlflow import tracking  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise errors.ConfigError(
        'config.mlflow.tracking_uri is set but MLflow is not installed: pip '
        'install "ctl[mlflow]" (or mlflow), or leave the URI empty.') from error
  try:
    # As MLflow parses it, here, before any of its requests: a malformed
    # URI is a config mistake, not a server that does not answer.
    urllib.parse.urlsplit(tracking_uri)
    return tracking.MlflowClient(tracking_uri=tracking_uri)
  except ValueError as error:
    raise errors.ConfigError(
        f'config.mlflow.tracking_uri={tracking_uri!r} is not a URI ({error}): '
        "set one as 'http://localhost:5000', or '' for no MLflow.") from error


def reachable_client(tracking_uri: str):
  """client(tracking_uri), once the server answered.

  Raises:
    CtlError: it does not answer (after MLflow's few retries).
  """
  mlflow = client(tracking_uri)
  try:
    mlflow.search_experiments(max_results=1)
  except Exception as error:  # pylint: disable=broad-except
    raise errors.CtlError(
        f'MLflow tracking server {tracking_uri} cannot be reached '
        f'({type(error).__name__}: {str(error)[:200]}). Start it, or fix '
        'config.mlflow.tracking_uri; nothing was trained.') from error
  return mlflow


def open_run(mlflow, *, workdir: str, experiment: str, run_name: str = '',
             tags: Mapping[str, str] | None = None) -> str:
  """The id of workdir's MLflow run: the one in workdir/mlflow.json, set
  running again, or a new one (recorded there)."""
  path = workdir_lib.mlflow_run_path(workdir)
  recorded = storage.read_json(path)
  if recorded is not None:
    run_id = recorded['run_id']
    mlflow.update_run(run_id, status='RUNNING')
    logging.info('MLflow: continuing run %s', run_id)
    return run_id
  found = mlflow.get_experiment_by_name(experiment)
  experiment_id = (found.experiment_id if found else
                   mlflow.create_experiment(experiment))
  run = mlflow.create_run(
      experiment_id,
      run_name=run_name or os.path.basename(_absolute(workdir).rstrip('/')),
      tags={'ctl.workdir': _absolute(workdir), **(tags or {})})
  run_id = run.info.run_id
  storage.write_json(path, {'run_id': run_id, 'experiment': experiment,
                                'tracking_uri': mlflow.tracking_uri})
  logging.info('MLflow: run %s in experiment %r at %s', run_id, experiment,
               mlflow.tracking_uri)
  return run_id


def recorded_run(workdir: str) -> str | None:
  """The MLflow run id recorded in workdir, if any."""
  recorded = storage.read_json(workdir_lib.mlflow_run_path(workdir))
  return recorded['run_id'] if recorded else None


def flat_params(config: ml_collections.ConfigDict) -> dict[str, str]:
  """The config as MLflow params: {'optimizer.learning_rate': '0.01'}."""
  params = {}

  def add(prefix, value):
    if isinstance(value, Mapping):
      for key, item in value.items():
        add(f'{prefix}{key}.', item)
    else:
      params[prefix[:-1]] = str(value)[:_MAX_PARAM_CHARS]

  add('', config.to_dict())
  return params


def log_export(config: ml_collections.ConfigDict, workdir: str,
               export_dir: str) -> None:
  """Uploads the export as the run's artifacts under export/ (a failure is
  logged: the run and its export are whole without it)."""
  run_id = recorded_run(workdir)
  if not enabled(config) or run_id is None:
    return
  try:
    client(config.mlflow.tracking_uri).log_artifacts(
        run_id, export_dir, artifact_path='export')
  except Exception as error:  # pylint: disable=broad-except
    logging.warning('MLflow did not take the export (%s: %s); it is in %s.',
                    type(error).__name__, str(error)[:200], export_dir)
    return
  logging.info('MLflow: export logged as artifacts of run %s', run_id)


def sweep_parent(trial_config: ml_collections.ConfigDict,
                 sweep_workdir: str) -> str | None:
  """The sweep's parent run (created once, continued when run again) where
  its trials log to MLflow; None where they do not."""
  if not enabled(trial_config):
    return None
  return open_run(reachable_client(trial_config.mlflow.tracking_uri),
                  workdir=sweep_workdir,
                  experiment=trial_config.mlflow.experiment,
                  tags={'ctl.sweep': 'parent'})


def finish_sweep_parent(trial_config: ml_collections.ConfigDict,
                        sweep_workdir: str, results_csv: str,
                        all_finished: bool) -> None:
  """results.csv as the parent run's artifact; the run ended (FINISHED, or
  FAILED when a trial failed)."""
  run_id = recorded_run(sweep_workdir)
  if not enabled(trial_config) or run_id is None:
    return
  mlflow = client(trial_config.mlflow.tracking_uri)
  try:
    mlflow.log_artifact(run_id, results_csv)
    mlflow.set_terminated(run_id, 'FINISHED' if all_finished else 'FAILED')
  except Exception as error:  # pylint: disable=broad-except
    logging.warning('MLflow did not take the sweep\'s results (%s: %s).',
                    type(error).__name__, str(error)[:200])


def _absolute(path: str) -> str:
  """A local path made absolute; a URL (gs://...) as it is."""
  return os.path.abspath(path) if storage.is_local(path) else path
