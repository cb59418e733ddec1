"""Runs a hyperparameter sweep defined in experiments/.

    python -m ctl.sweep --sweep=experiments/digits_lr.py --workdir=/tmp/sweeps/lr --parallel=2

Every trial is a `python -m ctl.main` process (through `ctl.launch` when the
sweep asks for several workers) in a workdir of its own, named after its
overrides; the command is saved in sweep.json, so any trial can also be run
alone. All trials' overrides are checked before any trial starts. Running
the same command again skips finished trials and resumes unfinished ones
from their checkpoints. A failed trial is reported and the others go on.

Writes, in --workdir:
    sweep.json            the plan: config, metric, each trial's overrides and command
    <trial>/              the trial's workdir, its log.txt and trial.json (exit code, wall time)
    results.csv           one row per trial: overrides, final metrics, step, wall time
    <metric>.png          the metric against each swept hyperparameter
    events.*.hparams      TensorBoard HParams (with one per trial workdir)

Exit codes: 0 every trial finished; 1 some trial failed; 2 a bad sweep or
override (nothing ran); 42 stopped by SIGTERM or Ctrl-C (running trials saved
a checkpoint; run the same command again to go on).
"""

import dataclasses
import os
import signal
import sys
import tempfile
import time

from absl import app
from absl import flags

from ctl import config as config_lib
from ctl import errors
from ctl import storage
from ctl.runtime import subprocesses
from ctl.runtime import workdir as workdir_lib
from ctl.sweep import trials as trials_lib

_SWEEP = flags.DEFINE_string('sweep', None,
                             'Sweep file defining get_sweep(), e.g. '
                             'experiments/digits_lr.py.')
_WORKDIR = flags.DEFINE_string('workdir', None,
                               'Directory for the trials and the results.')
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Trials run at once.',
                                 lower_bound=1)
flags.mark_flags_as_required(['sweep', 'workdir'])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  try:
    sweep, config_file = trials_lib.load_sweep(_SWEEP.value)
    trials = trials_lib.plan(sweep, config_file, _WORKDIR.value)
  except errors.ConfigError as error:
    print(f'ctl.sweep: error: {error}', file=sys.stderr)
    sys.exit(error.exit_code)
  workdir_lib.prepare(_WORKDIR.value)
  trials, trial_config = _with_mlflow_parent(trials, config_file)
  storage.write_json(os.path.join(_WORKDIR.value, 'sweep.json'), {
      'sweep': os.path.abspath(_SWEEP.value), 'config': config_file,
      'metric': sweep.metric, 'mode': sweep.mode,
      'num_workers': sweep.num_workers,
      'trials': [{'name': trial.name, 'overrides': trial.overrides,
                  'command': list(trial.command)} for trial in trials]})
  stopped = _Runner(trials, _PARALLEL.value).run()
  # Imported late: TensorFlow and matplotlib are slow to import, and a bad
  # sweep should fail fast.
  from ctl.sweep import report as sweep_report  # pylint: disable=g-import-not-at-top
  report = sweep_report.write(sweep, trials, _WORKDIR.value)
  print(report.summary)
  if not stopped:
    _finish_mlflow_parent(trial_config, report)
  if stopped:
    sys.exit(errors.EXIT_PREEMPTED)
  sys.exit(0 if report.all_finished else errors.EXIT_FAILURE)


def _with_mlflow_parent(trials, config_file):
  """Where the trials log to MLflow, the sweep's parent run (one per sweep
  workdir) in every trial's command; and a trial's config."""
  trial_config = config_lib.load(config_file, trials[0].overrides)
  if not trial_config.mlflow.tracking_uri:
    return trials, trial_config
  from ctl.training import mlflow_logger  # pylint: disable=g-import-not-at-top
  try:
    parent = mlflow_logger.sweep_parent(trial_config, _WORKDIR.value)
  except errors.CtlError as error:
    print(f'ctl.sweep: error: {error}', file=sys.stderr)
    sys.exit(error.exit_code)
  flag = f'--config.mlflow.parent_run_id={parent}'
  return [dataclasses.replace(trial, command=(*trial.command, flag))
          for trial in trials], trial_config


def _finish_mlflow_parent(trial_config, report) -> None:
  if trial_config.mlflow.tracking_uri:
    from ctl.training import mlflow_logger  # pylint: disable=g-import-not-at-top
    mlflow_logger.finish_sweep_parent(
        trial_config, _WORKDIR.value, report.results_csv, report.all_finished)


class _Runner:
  """Runs the unfinished trials, `parallel` at a time."""

  def __init__(self, trials: list[trials_lib.Trial], parallel: int):
    self._trials = trials
    self._parallel = parallel
    self._running = {}  # Popen -> (trial, start time, log file)
    self._stop_requested = False

  def run(self) -> bool:
    """Runs every unfinished trial; returns whether a signal stopped it."""
    pending = []
    for trial in self._trials:
      if trial.finished:
        _say(f'{trial.name}: finished before, skipped')
      else:
        pending.append(trial)
    previous = {signum: signal.signal(signum, self._request_stop)
                for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
      while pending or self._running:
        while (pending and len(self._running) < self._parallel and
               not self._stop_requested):
          self._start(pending.pop(0))
        self._collect_exited()
        time.sleep(0.2)
    finally:
      for signum, handler in previous.items():
        signal.signal(signum, handler)
    return self._stop_requested

  def _start(self, trial: trials_lib.Trial) -> None:
    storage.makedirs(trial.workdir)
    log = open(_local_log(trial), 'a')  # pylint: disable=consider-using-with
    log.write(f'=== {time.strftime("%Y-%m-%d %H:%M:%S")}: '
              f'{" ".join(trial.command)}\n')
    log.flush()
    process = subprocesses.start(list(trial.command), stdout=log)
    self._running[process] = (trial, time.monotonic(), log)
    _say(f'{trial.name}: started (pid {process.pid})')

  def _collect_exited(self) -> None:
    for process in [p for p in self._running if p.poll() is not None]:
      trial, started, log = self._running.pop(process)
      log.close()
      _publish_log(trial)
      record = trial.record()
      record.update(
          overrides=trial.overrides, exit_code=process.returncode,
          wall_seconds=record.get('wall_seconds', 0.0) +
          time.monotonic() - started)
      storage.write_json(os.path.join(trial.workdir, 'trial.json'),
                             record)
      if process.returncode == 0:
        _say(f'{trial.name}: finished in {record["wall_seconds"]:.1f} s')
      else:
        _say(f'{trial.name}: FAILED with exit code {process.returncode}; '
             f'log: {os.path.join(trial.workdir, "log.txt")}')

  def _request_stop(self, signum, frame) -> None:
    del frame
    if not self._stop_requested:
      _say(f'{signal.Signals(signum).name}: stopping the running trials; '
           'they save a checkpoint. Run the same command to go on.')
    self._stop_requested = True
    for process in self._running:
      process.send_signal(signal.SIGTERM)


def _local_log(trial: trials_lib.Trial) -> str:
  """The file a trial's output goes to: its workdir's log.txt, or for a
  workdir on an object store (which cannot take a process's output) a
  local file, copied there when the trial exits."""
  if storage.is_local(trial.workdir):
    return os.path.join(trial.workdir, 'log.txt')
  return os.path.join(tempfile.gettempdir(),
                      f'ctl-sweep-{os.getpid()}-{trial.name}.log')


def _publish_log(trial: trials_lib.Trial) -> None:
  if storage.is_local(trial.workdir):
    return  # Written in place.
  local = _local_log(trial)
  storage.append_text(os.path.join(trial.workdir, 'log.txt'),
                      storage.read_text(local) or '')
  storage.remove(local)


def _say(message: str) -> None:
  print(f'[sweep] {message}', flush=True)


if __name__ == '__main__':
  app.run(main)
