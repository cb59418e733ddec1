"""MLflow: a run's logged values sent to its MLflow run, off the training
thread (the run itself, its params and the sweep's parents:
mlflow_run.py).

Training never waits on the server: each write queues the values in
workdir/mlflow_pending.jsonl (mlflow_pending.py) and a thread sends them;
a value leaves that file once MLflow acknowledged it. While the server is
down or stopped, values wait there (sent again every few seconds); a run
killed meanwhile leaves them for the next run in the workdir, which sends
them first. Closing it (the end of training) waits up to
config.mlflow.end_wait_seconds for the last ones, then leaves them to the
same command run again ("already finished": send_left_over).
"""

from collections.abc import Mapping
import threading
from typing import Any

from absl import logging
import ml_collections

from ctl import metric_writers
from ctl.metric_writers import mlflow_pending
from ctl.runtime import workdir as workdir_lib
from ctl.metric_writers import mlflow_run

_BATCH = 1000  # MLflow's limit of metrics in one log_batch.
_RETRY_SECS = 5.0  # Between sends while the server does not take them.
# What MLflow does not get: each worker's timings (6 a worker a report).
_NOT_SENT = 'workers/'


class MlflowWriter(metric_writers.MetricWriter):
  """Sends values to the run's MLflow run (made in this workdir, or
  continued); on the chief. The server must answer when it is made.

  Values wait in memory until `flush()`, then in the workdir's pending file
  (mlflow_pending.PendingValues) until a thread of this writer sent them.
  `close()` is the end of training: the last values sent, the MLflow run
  marked FINISHED (not called when a run is preempted: it resumes).
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self._settings = config.mlflow
    self._params = mlflow_run.flat_params(config)
    self._workdir = workdir
    self._mlflow = mlflow_run.reachable_client(config.mlflow.tracking_uri)
    self._pending = mlflow_pending.PendingValues(
        workdir_lib.mlflow_pending_path(workdir))
    self._run_id = None  # Opened by the sender: training has started.
    self._wake = threading.Event()  # Values were queued, or training ended.
    self._ending = threading.Event()  # Training ended: finish the run.
    self._finished = threading.Event()  # Everything sent, the run FINISHED.
    self._failing = False  # The last send failed (warned once).
    self._sender = None  # The thread, started with the first values.
    self._unqueued = {}  # {step: {name: value}} written, not queued yet.

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    self._unqueued.setdefault(step, {}).update(
        {name: value for name, value in scalars.items()
         if isinstance(value, (int, float)) and
         not name.startswith(_NOT_SENT)})

  def flush(self) -> None:
    """Queues the values written (each step's at once) and wakes the
    sender thread."""
    for step, values in self._unqueued.items():
      self._pending.add(step, values)
    self._unqueued = {}
    dropped = self._pending.take_dropped()
    if dropped:
      logging.warning('MLflow: %d values not sent were dropped, the oldest '
                      '(over %d held while the server does not take them).',
                      dropped, mlflow_pending.MAX_PENDING)
    self._send_soon(finish=False)

  def close(self) -> None:
    """Training ended: waits a bounded time for the last values to be
    sent and the MLflow run to be marked FINISHED."""
    self.flush()
    self._send_soon(finish=True)

  def send_left_over(self) -> None:
    """Training had finished before this run: sends what it left unsent
    (the server was down) and marks the MLflow run FINISHED if it is not."""
    run_id = mlflow_run.recorded_run(self._workdir)
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
    run_id = mlflow_run.open_run(
        self._mlflow, workdir=self._workdir,
        experiment=self._settings.experiment,
        run_name=self._settings.run_name,
        tags={mlflow_run.PARENT_TAG: parent} if parent else None)
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
