"""A search's sweep process: asks the study for trials and runs them.

Any number of these processes, on one machine or many, share one study
(ctl/sweep/study.py). Each runs up to `parallel` trials at a time: first a
RUNNING trial nobody holds any more (its process died, or was stopped by
SIGTERM), resumed from its checkpoint; else a new trial asked of the study,
while the study has fewer than num_trials. It ends when every trial of the
budget is COMPLETE, PRUNED or FAIL, so that as long as one sweep process
lives no trial is left RUNNING unheld. A trial a signal killed is started
again (study.MAX_RESTARTS); a storage that stops answering is waited for
(outage.Outage) while the trials run on.

A trial is a `python -m ctl.main` run (a warm slot's or a process's own,
ctl/sweep/slots.py), as a grid's trials are, in <workdir>/trial-NNNN,
told by config.search where its study is (its chief reports each
evaluation and stops when pruned, ctl/training/pruning.py).
"""

import os
import re
import signal
import time
from typing import Any

from ctl import config as config_lib
from ctl import errors
from ctl import hyper
from ctl import storage
from ctl.runtime import studies
from ctl.runtime import workdir as workdir_lib
from ctl.sweep import outage as outage_lib
from ctl.sweep import slots as slots_lib
from ctl.sweep import study as study_lib
from ctl.sweep import trials as trials_lib

_POLL_SECONDS = 0.2  # Between checks of the running trials.
_STUDY_POLL_SECONDS = 1.0  # Between reads of the study for work.
# Metrics whose eval result (named after this) is reported at evaluations.
_EVALUATED = re.compile(r'^(best\.)?eval\.')


def check(sweep: hyper.Sweep, config_file: str) -> None:
  """Checks the search's keys and metric before anything runs.

  Every key is tried at its distribution's ends (and every choice), so a
  misspelt key or a value the config refuses stops the sweep at once.

  Raises:
    ConfigError: listing each problem.
  """
  search = sweep.search
  problems = []
  config = None
  for overrides in _corners(search):
    try:
      config = config_lib.load(config_file, overrides)
    except errors.ConfigError as error:
      problems.append(str(error))
  problem = config and trials_lib.metric_problem(sweep.metric, config)
  if problem:
    problems.append(problem)
  if search.pruner and not _EVALUATED.match(sweep.metric):
    problems.append(f'Sweep.metric {sweep.metric!r}: a pruner compares eval '
                    "results at each evaluation: use '[best.]eval.<name>'.")
  problems += _optuna_problems(search)
  if problems:
    raise errors.ConfigError(
        'The search cannot run; nothing was started:\n  ' +
        '\n  '.join(dict.fromkeys(problems)))


def _optuna_problems(search: hyper.Search) -> list[str]:
  """Why Optuna would refuse the search's pruner or sampler: found by
  making them as the study will and sampling in memory, before any file is
  written."""
  problems = []
  try:
    studies.make_pruner(search.pruner, dict(search.pruner_options))
  except Exception as error:  # pylint: disable=broad-except
    problems.append(f'Search.pruner_options={dict(search.pruner_options)!r} '
                    f'do not fit pruner={search.pruner!r}: '
                    f'{type(error).__name__}: {error}')
  try:
    study_lib.try_sampler(search)  # Some options fail only in sampling.
  except Exception as error:  # pylint: disable=broad-except
    problems.append(f'Search.sampler_options={dict(search.sampler_options)!r}'
                    f' do not fit sampler={search.sampler!r} (seed '
                    f'{search.seed}): {type(error).__name__}: {error}')
  return problems


def _corners(search: hyper.Search) -> list[dict[str, Any]]:
  """Overrides at each end of every distribution, every choice once."""
  lows, highs, choices = {}, {}, []
  for key, distribution in search.space.items():
    if isinstance(distribution, hyper.choice):
      lows[key] = highs[key] = distribution.values[0]
      choices += [{key: value} for value in distribution.values[1:]]
    else:
      lows[key], highs[key] = distribution.low, distribution.high
  return [{**search.fixed, **lows}, {**search.fixed, **highs},
          *({**search.fixed, **lows, **choice} for choice in choices)]


class Runner:
  """One sweep process of a search: claims and asks for trials, runs them."""

  def __init__(self, sweep: hyper.Sweep, config_file: str, workdir: str,
               study, storage_url: str, processes: slots_lib.TrialProcesses,
               waits: outage_lib.Waits, extra_flags: tuple[str, ...] = ()):
    self._sweep = sweep
    self._search = sweep.search
    self._config_file = config_file
    self._workdir = workdir
    self._study = study
    self._storage_url = storage_url
    self._processes = processes  # Warm slots or fresh processes.
    self._extra_flags = extra_flags
    self._leases = study_lib.Leases(study, waits.lease_seconds)
    self._outage = outage_lib.Outage(storage_url, waits.storage_seconds)
    self._running = {}  # Popen -> (number, Trial, start time, log file)
    self._untold = []  # (number, Trial, exit code, error): exited, not told
    self._renewed = 0.0
    self._looked = 0.0
    self._stops = trials_lib.StopSignals(
        'stopping the running trials; they save a checkpoint, and any sweep '
        'process of this study resumes them.')

  def run(self) -> bool:
    """Runs trials until the budget is done; returns whether a signal
    stopped it.

    A storage that stops answering is waited for (Waits.storage_seconds)
    while the trials go on; then the trials are stopped with a checkpoint.

    Raises:
      CtlError: the storage did not answer in time (its trials resumable).
    """
    gave_up = False
    with self._stops:
      while True:
        self._stops.forward(self._running)
        try:
          done = self._step()
        except outage_lib.storage_errors() as error:
          done = False
          if self._outage.failed(error) and not self._stops.requested:
            gave_up = True
            self._stops.request(
                'the study storage did not answer in time: stopping the '
                'running trials with a checkpoint.')
        if done or (self._stops.requested and not self._running):
          break  # Exits not told a storage that is down: left RUNNING.
        time.sleep(_POLL_SECONDS)
    if gave_up:
      raise self._outage.given_up()
    return self._stops.requested

  def _step(self) -> bool:
    """Collects exited trials, renews leases, starts trials; returns
    whether the budget is done."""
    self._collect_exited()
    if self._stops.requested:
      return False
    if time.monotonic() - self._looked < _STUDY_POLL_SECONDS:
      if not self._outage.down:
        self._renew()
      return False
    self._looked = time.monotonic()
    done = self._budget_done()  # While the storage is down: tries it.
    if self._outage.down:
      self._outage.answered()
      self._renewed = 0.0  # At once: the leases aged while it was down.
    self._renew()
    if done and not self._running:
      return True
    if len(self._running) < self._processes.parallel:
      self._start_next()
    return False

  def trials(self) -> list[tuple[trials_lib.Trial, str]]:
    """The budget's trials so far and their study states, by number."""
    return [(self._trial(frozen.number, self._overrides(frozen)),
             frozen.state.name)
            for frozen in self._budget_trials()]

  def _budget_trials(self):
    return [frozen for frozen in self._study.get_trials(deepcopy=False)
            if frozen.number < self._search.num_trials and
            not frozen.user_attrs.get(study_lib.SURPLUS)]

  def _budget_done(self) -> bool:
    trials = self._budget_trials()
    return (len(trials) >= self._search.num_trials and
            all(frozen.state.is_finished() for frozen in trials))

  def _overrides(self, frozen) -> dict[str, Any]:
    return {**study_lib.kept_seed(frozen), **self._search.fixed,
            **{key: frozen.params[key] for key in self._search.space
               if key in frozen.params}}

  def _trial(self, number: int, overrides: dict[str, Any]) -> trials_lib.Trial:
    name = study_lib.trial_name(number)
    workdir = os.path.join(self._workdir, name)
    command = (*trials_lib.command(self._sweep, self._config_file, workdir,
                                   overrides), *self._extra_flags)
    if _EVALUATED.match(self._sweep.metric):  # Reported at evaluations.
      command += (f'--config.search.storage={self._storage_url}',
                  f'--config.search.study={self._study.study_name}',
                  f'--config.search.trial={number}',
                  '--config.search.metric='
                  + _EVALUATED.sub('', self._sweep.metric))
    return trials_lib.Trial(name, overrides, workdir, command)

  def _start_next(self) -> None:
    """Starts a trial nobody holds, else a new one, if there is either."""
    mine = {number for number, *_ in self._running.values()}
    for frozen in self._budget_trials():
      if (frozen.state.name == 'RUNNING' and frozen.number not in mine and
          self._leases.is_free(frozen)):
        if self._leases.claim(frozen):
          self._show_workdir(frozen)
          trials_lib.say(f'{study_lib.trial_name(frozen.number)}: taken over (nobody '
               'held it); resuming it from its checkpoint')
          self._start(frozen.number, self._overrides(
              study_lib.drawn(self._study, self._search, frozen)))
          return
    if len(self._budget_trials()) < self._search.num_trials:
      self._ask()

  def _ask(self) -> None:
    """A new trial: its values sampled by the study's sampler."""
    optuna_trial = self._study.ask()
    number = optuna_trial.number
    frozen = self._study._storage.get_trial(optuna_trial._trial_id)  # pylint: disable=protected-access
    self._leases.hold(frozen)
    if number >= self._search.num_trials:
      # Another process asked for the last trial at the same moment.
      optuna_trial.set_user_attr(study_lib.SURPLUS, True)
      self._study.tell(optuna_trial, state=study_lib.FAIL_STATE)
      return
    self._show_workdir(frozen)
    values = study_lib.draw(self._study, self._search, optuna_trial)
    self._start(number, {**values, **self._search.fixed})

  def _show_workdir(self, frozen) -> None:
    """Names the trial's workdir, as this process runs it, in the study
    (optuna-dashboard shows it with the trial)."""
    workdir = os.path.join(self._workdir, study_lib.trial_name(frozen.number))
    self._study._storage.set_trial_user_attr(  # pylint: disable=protected-access
        frozen._trial_id, study_lib.WORKDIR,  # pylint: disable=protected-access
        workdir if '://' in workdir else os.path.abspath(workdir))

  def _start(self, number: int, overrides: dict[str, Any]) -> None:
    trial = self._trial(number, overrides)
    storage.makedirs(trial.workdir)
    log = trial.open_log()
    log.write(f'=== {time.strftime("%Y-%m-%d %H:%M:%S")}: '
              f'{" ".join(trial.command)}\n')
    log.flush()
    process = self._processes.start(trial.command, log)
    self._running[process] = (number, trial, time.monotonic(), log)
    trials_lib.say(f'{trial.name}: started (pid {process.pid}): '
         + ' '.join(config_lib.override_flags(overrides)))

  def _renew(self) -> None:
    """Renews this process's leases; stops a trial another process took."""
    if time.monotonic() - self._renewed < self._leases.lease_seconds / 4:
      return
    self._renewed = time.monotonic()
    for process, (number, trial, _, _) in self._running.items():
      if not self._leases.held_by_me(number):
        trials_lib.say(f'{trial.name}: another sweep process took it over; stopping '
             'it here')
        process.send_signal(signal.SIGTERM)
        continue
      self._leases.hold(self._frozen(number))

  def _frozen(self, number: int):
    return self._study._storage.get_trial(  # pylint: disable=protected-access
        studies.trial_id(self._study, number))

  def _collect_exited(self) -> None:
    """Records the exited trials in trial.json, then in the study (those
    not told yet first, the storage having been down)."""
    for process in [p for p in self._running if p.poll() is not None]:
      number, trial, started, log = self._running.pop(process)
      log.close()
      error = trial.error_line() if process.returncode else None
      trial.publish_log()
      record = trial.record()
      record.update(overrides=trial.overrides, exit_code=process.returncode,
                    **self._processes.finished(process),
                    wall_seconds=record.get('wall_seconds', 0.0) +
                    time.monotonic() - started)
      record.pop('error', None)
      if error:
        record['error'] = error
      storage.write_json(os.path.join(trial.workdir, 'trial.json'), record)
      self._untold.append((number, trial, process.returncode, error))
    while self._untold:
      self._tell(*self._untold[0])
      self._untold.pop(0)

  def _tell(self, number: int, trial: trials_lib.Trial, code: int,
            error: str | None) -> None:
    """Records how a trial's process ended in the study (error: its
    `ctl: error:` line, if it printed one); restarts one a signal killed."""
    frozen = self._frozen(number)
    if frozen.state.is_finished() or not self._leases.held_by_me(number):
      return  # Another process holds it now (it took it over).
    log = os.path.join(trial.workdir, 'log.txt')
    if self._stops.stopped(code):
      self._leases.release(frozen)
      trials_lib.say(f'{trial.name}: stopped with a checkpoint; any sweep process of '
           'this study resumes it')
      return
    killer = trials_lib.killing_signal(code, error)
    if killer:
      restarts = frozen.user_attrs.get(study_lib.RESTARTS, 0)
      if restarts < study_lib.MAX_RESTARTS:
        self._study._storage.set_trial_user_attr(  # pylint: disable=protected-access
            frozen._trial_id, study_lib.RESTARTS, restarts + 1)  # pylint: disable=protected-access
        trials_lib.say(f'{trial.name}: killed by {killer}, not by an error '
                       'of its own; restarting it from its checkpoint '
                       f'(restart {restarts + 1} of {study_lib.MAX_RESTARTS})')
        self._start(number, trial.overrides)
        return
      error = (f'killed by {killer} after {study_lib.MAX_RESTARTS} restarts '
               'from its checkpoint')
    results = workdir_lib.read_results(trial.workdir) if code == 0 else None
    value = trials_lib.lookup(results, self._sweep.metric) if results else None
    stopped = (results or {}).get('stopped') or {}
    if results is not None and studies.was_pruned(results):
      self._study.tell(number, state=study_lib.PRUNED_STATE,
                       skip_if_finished=True)
      trials_lib.say(f'{trial.name}: PRUNED at step {stopped["step"]}')
    elif value is not None:
      self._study.tell(number, float(value), skip_if_finished=True)
      trials_lib.say(f'{trial.name}: COMPLETE, {self._sweep.metric} {value:.4f}')
    else:
      why = (f'exit code {code}' if results is None else
             f'no {self._sweep.metric} in its results')
      if error:  # A task of one's own without the metric says so here.
        why += f': {error.rstrip(".")}'
      self._study._storage.set_trial_user_attr(  # pylint: disable=protected-access
          frozen._trial_id, study_lib.FAILURE, f'{why}; log: {log}')  # pylint: disable=protected-access
      self._study.tell(number, state=study_lib.FAIL_STATE,
                       skip_if_finished=True)
      trials_lib.say(f'{trial.name}: FAILED with {why}; log: {log}')
