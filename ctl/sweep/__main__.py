"""Runs a hyperparameter sweep defined in experiments/.

    python -m ctl.sweep --sweep=experiments/digits_lr.py --workdir=/tmp/sweeps/lr --parallel=2

Every trial is a `python -m ctl.main` run, one after another in a warm
process per --parallel slot (ctl/sweep/slots.py; --warm_trials=false: a
process each; `ctl.launch` when the sweep asks for several workers) in a
workdir of its own, named after its
overrides; the command is saved in sweep.json, so any trial can also be run
alone. All trials' overrides are checked before any trial starts. Running
the same command again skips finished trials and resumes unfinished ones
from their checkpoints. A failed trial is reported and the others go on.

Writes, in --workdir:
    sweep.json            the plan: config, metric, each trial's overrides and command
    <trial>/              the trial's workdir, its log.txt and trial.json (exit code, error line, wall time, pid, warm)
    results.csv           one row per trial: overrides, final metrics, step, wall time
    <metric>.png          the metric against each swept hyperparameter
    events.*.hparams      TensorBoard HParams (with one per trial workdir)
    study.journal         a search's Optuna study (without --storage)

A sweep file with a search (hyper.Search) runs an Optuna study instead
(ctl/sweep/search.py): the same command, started any number of times on
one machine or many, joins the study and runs its trials, trial-NNNN, until
num_trials are done. Its storage is `study.journal` in --workdir, or
--storage (a database URL) for sweep processes on several machines;
results.csv then has each trial's state (COMPLETE, PRUNED, FAIL, RUNNING).

Exit codes: 0 every trial finished (or was pruned); 1 some trial failed, or
the study's storage does not answer; 2 a bad sweep or override, or a study
of another search in that storage (nothing ran); 42 stopped by SIGTERM or
Ctrl-C (running trials saved a checkpoint; run the same command again to go
on).
"""

import dataclasses
import os
import sys
import time

from absl import app
from absl import flags

from ctl import config as config_lib
from ctl import errors
from ctl import storage
from ctl.runtime import studies
from ctl.runtime import tf_process
from ctl.runtime import workdir as workdir_lib
from ctl.sweep import slots as slots_lib
from ctl.sweep import trials as trials_lib

_SWEEP = flags.DEFINE_string('sweep', None,
                             'Sweep file defining get_sweep(), e.g. '
                             'experiments/digits_lr.py.')
_WORKDIR = flags.DEFINE_string('workdir', None,
                               'Directory for the trials and the results.')
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Trials run at once.',
                                 lower_bound=1)
_STORAGE = flags.DEFINE_string(
    'storage', '', "A search's study storage: a database URL "
    '(postgresql://user@host:5432/db) that sweep processes on several '
    'machines share; default: a journal file in --workdir.')
_STUDY = flags.DEFINE_string(
    'study', '', "A search's study name in its storage; default: the "
    "workdir's name.")
_LEASE_SECONDS = flags.DEFINE_float(
    'lease_seconds', 60.0, 'A search: a running trial whose sweep process '
    'has not renewed its lease for this long (its machine died) is taken '
    'over by another sweep process.', lower_bound=1.0)
_STORAGE_WAIT_SECONDS = flags.DEFINE_float(
    'storage_wait_seconds', 600.0, 'A search: how long a sweep process '
    'waits for a study storage that stopped answering (a database '
    'restarting), its trials running on, before it stops them with a '
    'checkpoint and exits 1.', lower_bound=0.0)
_WARM_TRIALS = flags.DEFINE_boolean(
    'warm_trials', True, 'Run each --parallel slot\'s trials one after '
    'another in one warm process, which imports TensorFlow once (README: '
    'what a trial shares with the trials before it); false: each trial in '
    'a process of its own.')
_SLOT_TRIALS = flags.DEFINE_integer(
    'slot_trials', 20, 'A warm slot is replaced by a fresh process after '
    'this many trials.', lower_bound=1)
_SLOT_MEMORY_MB = flags.DEFINE_integer(
    'slot_memory_mb', 4096, 'A warm slot is replaced by a fresh process '
    'after a trial that left its resident memory above this many MiB.',
    lower_bound=1)
flags.mark_flags_as_required(['sweep', 'workdir'])


def _trial_processes() -> slots_lib.TrialProcesses:
  """Where the trials run: warm slots, or a fresh process each."""
  limits = (slots_lib.SlotLimits(_SLOT_TRIALS.value, _SLOT_MEMORY_MB.value)
            if _WARM_TRIALS.value else None)
  return slots_lib.TrialProcesses(_PARALLEL.value, limits)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  try:
    # The inputs are checked before TensorFlow loads (10 s or more), quietly
    # all the same: a task's config file may import it.
    with tf_process.quiet_start_up():
      _check_text(*(f'--{flag.name}={flag.value}'
                    for flag in (_SWEEP, _WORKDIR, _STORAGE, _STUDY)))
      sweep, config_file = trials_lib.load_sweep(_SWEEP.value)
      _check_text(f'Sweep.config {config_file}')
      if sweep.search is None:
        trials = trials_lib.plan(sweep, config_file, _WORKDIR.value)
      else:
        _search_lib().check(sweep, config_file)
  except errors.ConfigError as error:
    _fail(error)
  # TensorFlow, which ctl.storage imports for gs:// and the report for its
  # summaries, prints its start-up lines (CUDA, CPU instructions) whatever
  # TF_CPP_MIN_LOG_LEVEL says: imported quietly, and only when needed, so
  # that the first trial's process does not wait for this one's import.
  if not storage.is_local(_WORKDIR.value):
    tf_process.import_tensorflow()
  if sweep.search is not None:
    _run_search(sweep, config_file)
  workdir_lib.prepare(_WORKDIR.value)
  trial_config = config_lib.load(config_file, trials[0].overrides)
  parent_flags = _mlflow_parent_flags(trial_config)
  trials = [dataclasses.replace(trial, command=(*trial.command, *parent_flags))
            for trial in trials]
  storage.write_json(os.path.join(_WORKDIR.value, 'sweep.json'), {
      'sweep': os.path.abspath(_SWEEP.value), 'config': config_file,
      'metric': sweep.metric, 'mode': sweep.mode,
      'num_workers': sweep.num_workers,
      'trials': [{'name': trial.name, 'overrides': trial.overrides,
                  'command': list(trial.command)} for trial in trials]})
  processes = _trial_processes()
  try:
    stopped = _Runner(trials, processes).run()
  finally:
    processes.close()
  report = _report_lib().write(sweep, trials, _WORKDIR.value)
  print(report.summary)
  if not stopped:
    _finish_mlflow_parent(trial_config, report)
  if stopped:
    sys.exit(errors.EXIT_PREEMPTED)
  sys.exit(0 if report.all_finished else errors.EXIT_FAILURE)


def _report_lib():
  """ctl.sweep.report, imported once the trials have ended: TensorFlow and
  matplotlib are slow to import (quietly here), and a bad sweep should
  fail fast."""
  tf_process.import_tensorflow()
  from ctl.sweep import report  # pylint: disable=g-import-not-at-top
  return report


def _search_lib():
  """ctl.sweep.search, imported when a sweep has a search: Optuna is for
  searches only (the extra ctl[sweep])."""
  from ctl.sweep import search  # pylint: disable=g-import-not-at-top
  return search


def _run_search(sweep, config_file) -> None:
  """Runs a search's trials in its study with the others sweep processes
  of that study; exits."""
  search_lib = _search_lib()
  from ctl.sweep import study as study_lib  # pylint: disable=g-import-not-at-top
  from ctl.sweep import outage as outage_lib  # pylint: disable=g-import-not-at-top
  url = study_lib.storage_url(_STORAGE.value, _WORKDIR.value)
  name = _STUDY.value or os.path.basename(os.path.normpath(_WORKDIR.value))
  try:
    study = study_lib.open_study(sweep, url, name)  # Before any file.
    workdir_lib.prepare(_WORKDIR.value)
  except errors.CtlError as error:
    _fail(error)
  trial_config = config_lib.load(config_file, dict(sweep.search.fixed))
  storage.write_json(os.path.join(_WORKDIR.value, 'sweep.json'), {
      'sweep': os.path.abspath(_SWEEP.value), 'config': config_file,
      'metric': sweep.metric, 'mode': sweep.mode,
      'num_workers': sweep.num_workers, 'storage': studies.shown(url),
      'study': name, 'search': study_lib.describe(sweep),
      'num_trials': sweep.search.num_trials})
  processes = _trial_processes()
  runner = search_lib.Runner(
      sweep, config_file, _WORKDIR.value, study, url, processes,
      outage_lib.Waits(_LEASE_SECONDS.value, _STORAGE_WAIT_SECONDS.value),
      _mlflow_parent_flags(trial_config))
  try:
    stopped = runner.run()
  except errors.CtlError as error:  # Its storage did not come back.
    _fail(error)
  finally:
    processes.close()
  try:
    trials = runner.trials()
  except outage_lib.storage_errors() as error:  # Down as SIGTERM stopped it.
    print(f'ctl.sweep: {studies.unreachable(url, error)}', file=sys.stderr)
    sys.exit(errors.EXIT_PREEMPTED if stopped else errors.EXIT_FAILURE)
  report = _report_lib().write(sweep, [trial for trial, _ in trials],
                               _WORKDIR.value,
                               states=[state for _, state in trials])
  print(report.summary)
  if not stopped:
    _finish_mlflow_parent(trial_config, report)
  if stopped:
    sys.exit(errors.EXIT_PREEMPTED)
  sys.exit(0 if report.all_finished else errors.EXIT_FAILURE)


def _check_text(*values: str) -> None:
  """Refuses a name that is not text: bytes that are not UTF-8 (a shell's
  $'\\xff'), which sweep.json, the trials' logs and their commands cannot
  hold."""
  for value in values:
    try:
      value.encode('utf-8')
    except UnicodeEncodeError as error:
      raise errors.ConfigError(
          f'{_shown(value)} is not UTF-8 text; use UTF-8 characters there. '
          'Nothing was written.') from error


def _shown(value: str) -> str:
  """A name that is not UTF-8 as it was given, each bad byte as \\xNN."""
  try:
    return os.fsencode(value).decode('utf-8', 'backslashreplace')
  except UnicodeError:  # Not bytes from the command line.
    return ascii(value)


def _fail(error: errors.CtlError) -> None:
  print(f'ctl.sweep: error: {error}', file=sys.stderr)
  sys.exit(error.exit_code)


def _mlflow_parent_flags(trial_config) -> tuple[str, ...]:
  """Where the trials log to MLflow, the flag naming the sweep's parent run
  (one per sweep workdir) for every trial's command."""
  if not trial_config.mlflow.tracking_uri:
    return ()
  from ctl.metric_writers import mlflow_run  # pylint: disable=g-import-not-at-top
  try:
    parent = mlflow_run.sweep_parent(trial_config, _WORKDIR.value)
  except errors.CtlError as error:
    _fail(error)
  return (f'--config.mlflow.parent_run_id={parent}',)


def _finish_mlflow_parent(trial_config, report) -> None:
  if trial_config.mlflow.tracking_uri:
    from ctl.metric_writers import mlflow_run  # pylint: disable=g-import-not-at-top
    mlflow_run.finish_sweep_parent(
        trial_config, _WORKDIR.value, report.results_csv, report.all_finished)


class _Runner:
  """Runs the unfinished trials, `parallel` at a time."""

  def __init__(self, trials: list[trials_lib.Trial],
               processes: slots_lib.TrialProcesses):
    self._trials = trials
    self._processes = processes  # Warm slots or fresh processes.
    self._running = {}  # Popen -> (trial, start time, log file)

  def run(self) -> bool:
    """Runs every unfinished trial; returns whether a signal stopped it."""
    pending = []
    for trial in self._trials:
      if trial.finished:
        trials_lib.say(f'{trial.name}: finished before, skipped')
      else:
        pending.append(trial)
    stops = trials_lib.StopSignals('stopping the running trials; they save '
                                   'a checkpoint. Run the same command to go '
                                   'on.')
    with stops:
      while (pending and not stops.requested) or self._running:
        while (pending and not stops.requested and
               len(self._running) < self._processes.parallel):
          self._start(pending.pop(0))
        stops.forward(self._running)
        self._collect_exited(stops)
        time.sleep(0.2)
    return stops.requested

  def _start(self, trial: trials_lib.Trial) -> None:
    storage.makedirs(trial.workdir)
    log = trial.open_log()
    log.write(f'=== {time.strftime("%Y-%m-%d %H:%M:%S")}: '
              f'{" ".join(trial.command)}\n')
    log.flush()
    process = self._processes.start(trial.command, log)
    self._running[process] = (trial, time.monotonic(), log)
    trials_lib.say(f'{trial.name}: started (pid {process.pid})')

  def _collect_exited(self, stops: trials_lib.StopSignals) -> None:
    for process in [p for p in self._running if p.poll() is not None]:
      trial, started, log = self._running.pop(process)
      log.close()
      stopped = stops.stopped(process.returncode)
      error = (trial.error_line() if process.returncode and not stopped
               else None)
      trial.publish_log()
      record = trial.record()
      record.update(
          overrides=trial.overrides, exit_code=process.returncode,
          **self._processes.finished(process),
          wall_seconds=record.get('wall_seconds', 0.0) +
          time.monotonic() - started)
      record.pop('error', None)
      if error:
        record['error'] = error
      storage.write_json(os.path.join(trial.workdir, 'trial.json'),
                             record)
      if process.returncode == 0:
        trials_lib.say(f'{trial.name}: finished in {record["wall_seconds"]:.1f} s')
      elif stopped:
        trials_lib.say(f'{trial.name}: stopped (exit code '
                       f'{process.returncode}); the same command resumes it')
      else:
        why = f': {error.rstrip(".")}' if error else ''
        trials_lib.say(f'{trial.name}: FAILED with exit code '
                       f'{process.returncode}{why}; log: '
                       f'{os.path.join(trial.workdir, "log.txt")}')


if __name__ == '__main__':
  app.run(main)
