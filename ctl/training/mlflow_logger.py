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

Training never waits on the server: the loop queues each value in
workdir/mlflow_pending.jsonl and a thread sends it; a value leaves that
file once MLflow acknowledged it. While the server is down or stopped,
values wait there (sent again every few seconds); a run killed meanwhile
leaves them for the next run in the workdir, which sends them first. The
end of training waits up to config.mlflow.end_wait_seconds (a minute) for
the last ones, then leaves them to the same command run again ("already
finished": send_left_over).
"""

from collections.abc import Mapping
import os
import threading
import urllib.parse

from absl import logging
import ml_collections

from ctl import actions
from ctl import errors
from ctl import storage
from ctl.checkpoints import best as best_lib
from ctl.runtime import workdir as workdir_lib
from ctl.training import mlflow_pending

_PARENT_TAG = 'mlflow.parentRunId'  # MLflow's own: runs nest under it.
_MAX_PARAM_CHARS = 6000  # MLflow's limit on a param's value.
_BATCH = 1000  # MLflow's limit of metrics in one log_batch.
_RETRY_SECS = 5.0  # Between sends while the server does not take them.


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


class MlflowLogger(actions.Action):
  """Logs the run to MLflow (see the module's docstring); on the chief.

  The loop only queues values (in the workdir's pending file, see
  mlflow_pending.PendingValues); a thread of this logger sends them, so
  that training never waits on the server.
  """

  when = actions.When(after_log=True, after_eval=True, at_end=True)

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self._settings = config.mlflow
    self._params = flat_params(config)
    self._workdir = workdir
    self._mlflow = reachable_client(config.mlflow.tracking_uri)
    self._pending = mlflow_pending.PendingValues(
        workdir_lib.mlflow_pending_path(workdir))
    self._run_id = None  # Opened by the sender: training has started.
    self._wake = threading.Event()  # Values were queued, or training ended.
    self._ending = threading.Event()  # Training ended: finish the run.
    self._finished = threading.Event()  # Everything sent, the run FINISHED.
    self._failing = False  # The last send failed (warned once).
    self._sender = None  # The thread, started with the first values.

  def run(self, event: actions.Event) -> None:
    values = {}
    if event.logged:
      values.update({f'train/{name}': value
                     for name, value in event.train_logs.items()
                     if isinstance(value, (int, float))})
    if event.evaluated:
      values.update({f'eval/{name}': value for name, value in
                     best_lib.flat_metrics(event.eval_results).items()})
    self._pending.add(event.step, values)
    dropped = self._pending.take_dropped()
    if dropped:
      logging.warning('MLflow: %d values not sent were dropped, the oldest '
                      '(over %d held while the server does not take them).',
                      dropped, mlflow_pending.MAX_PENDING)
    self._send_soon(finish=event.end)

  def send_left_over(self) -> None:
    """Training had finished before this run: sends what it left unsent
    (the server was down) and marks the MLflow run FINISHED if it is not."""
    run_id = recorded_run(self._workdir)
    if run_id is None:
      return
    try:
      finished = self._mlflow.get_run(run_id).info.status == 'FINISHED'
    except Exception:  # pylint: disable=broad-except
      finished = False
    if len(self._pending) or not finished:
      logging.info('MLflow: sending the %d values run %s was left without, '
                   'and finishing it.', len(self._pending), run_id)
      self._send_soon(finish=True)

  def _send_soon(self, finish: bool) -> None:
    """Wakes the sender thread (started once); once training has ended
    (`finish`), waits a bounded time for the values to be sent and the run
    to be marked FINISHED."""
    if self._sender is None:
      self._sender = threading.Thread(target=self._send_until_finished,
                                      name='ctl-mlflow', daemon=True)
      self._sender.start()
    if finish:
      self._ending.set()
    self._wake.set()
    if finish and not self._finished.wait(self._settings.end_wait_seconds):
      logging.warning(
          'MLflow did not take the last %d values within %s s; they are '
          'kept in %s and sent by the next run in this workdir.',
          len(self._pending), self._settings.end_wait_seconds,
          workdir_lib.mlflow_pending_path(self._workdir))

  def _send_until_finished(self) -> None:
    """The sender thread: sends what is queued when woken, again every
    _RETRY_SECS while MLflow does not take it, until the run finished."""
    while True:
      self._wake.wait(_RETRY_SECS if self._failing else None)
      self._wake.clear()
      # Read before sending: the values of the end were queued before.
      ending = self._ending.is_set()
      if self._send(finish=ending) and ending:
        self._finished.set()
        return

  def _send(self, finish: bool) -> bool:
    """Sends the queued values (and marks the run FINISHED if `finish`);
    whether MLflow took them all."""
    from mlflow import entities  # pylint: disable=g-import-not-at-top
    try:
      if self._run_id is None:
        self._open()
      while batch := self._pending.head(_BATCH):
        self._mlflow.log_batch(
            self._run_id, metrics=[entities.Metric(*entry) for entry in batch])
        self._pending.remove(batch)
      if finish:
        self._mlflow.set_terminated(self._run_id, 'FINISHED')
    except Exception as error:  # pylint: disable=broad-except
      if not self._failing:  # Once an outage, not at every retry.
        logging.warning(
            'MLflow did not take %d values (%s: %s); training goes on, and '
            'they are sent again (kept in the workdir until then).',
            len(self._pending), type(error).__name__, str(error)[:200])
      self._failing = True
      return False
    if self._failing:
      logging.info('MLflow takes values again.')
    self._failing = False
    return True

  def _open(self) -> None:
    """Opens (or continues) the run; drops the values it already has."""
    parent = self._settings.parent_run_id
    run_id = open_run(
        self._mlflow, workdir=self._workdir,
        experiment=self._settings.experiment,
        run_name=self._settings.run_name,
        tags={_PARENT_TAG: parent} if parent else None)
    run = self._mlflow.get_run(run_id)
    self._log_params(run_id, run.data.params)
    logged = {}  # Steps logged before a restart: the resumed run repeats them.
    for key in run.data.metrics:
      history = self._mlflow.get_metric_history(run_id, key)
      logged[key] = max(entry.step for entry in history)
    self._pending.drop_logged(logged)
    self._run_id = run_id

  def _log_params(self, run_id: str, logged: Mapping[str, str]) -> None:
    from mlflow import entities  # pylint: disable=g-import-not-at-top
    changed = sorted(key for key, value in self._params.items()
                     if key in logged and logged[key] != value)
    if changed:
      logging.warning('MLflow keeps a run\'s first params: these changed '
                      'since and are not updated: %s', ', '.join(changed))
    new = [entities.Param(key, value) for key, value in self._params.items()
           if key not in logged]
    for start in range(0, len(new), 100):  # MLflow's batch limit.
      self._mlflow.log_batch(run_id, params=new[start:start + 100])


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


class _OnTheChief(actions.Action):
  """The MlflowLogger's place on the other workers, never run there: every
  worker's list of actions is the same, as the loop agrees a chief-only
  action's requests on all of them (one collective each)."""

  when = MlflowLogger.when

  @property
  def name(self) -> str:
    return MlflowLogger.__name__

  def run(self, event: actions.Event) -> None:
    raise AssertionError('The MLflow logger runs on the chief only.')


def from_config(config: ml_collections.ConfigDict, workdir: str,
                is_chief: bool) -> list[actions.Action]:
  """The MlflowLogger when config.mlflow.tracking_uri is set (its place
  holder on the workers other than the chief)."""
  if not enabled(config):
    return []
  return [MlflowLogger(config, workdir) if is_chief else _OnTheChief()]


def _absolute(path: str) -> str:
  """A local path made absolute; a URL (gs://...) as it is."""
  return os.path.abspath(path) if storage.is_local(path) else path
