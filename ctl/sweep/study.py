"""A search's Optuna study: its storage, its sampler and pruner, and the
leases by which sweep processes share its trials.

Optuna (the extra ctl[sweep]) is imported only for a search: a grid sweep
never imports this module. The study's storage is a journal file in the sweep's
workdir by default (Optuna's JournalFileBackend: appends under a file lock,
so several processes, on one machine or a shared filesystem, write it at
once; SQLite locks under concurrent writers, optuna#820), or a database URL
(`postgresql://...`) that sweep processes on many machines reach.

A trial of the study is RUNNING from the moment a sweep process asks for it
until it is told COMPLETE, PRUNED or FAIL. The sweep process that runs it
holds its lease, a user attribute of the trial renewed every
lease_seconds / 4; a lease that is not renewed in lease_seconds (its
process died with its machine), or whose process on this host is gone, or
that was released (SIGTERM), lets another sweep process take the trial
over: it runs the same command in the same workdir, so the trial resumes
from its checkpoint with the same values. Optuna's own heartbeat would
mark such a trial FAIL instead, and a failed trial cannot run again.
"""

import dataclasses
import os
import socket
import time
import uuid
import warnings
from typing import Any

import numpy as np

from ctl import errors
from ctl import hyper
from ctl.runtime import studies
from ctl.sweep import gaussian_process

optuna = studies.import_optuna()

JOURNAL_FILE = 'study.journal'
LEASE = 'ctl.lease'  # The trial's user attribute holding its lease.
FAILURE = 'ctl.failure'  # Why a trial failed, with its log.
SURPLUS = 'ctl.surplus'  # Asked beyond num_trials by a race: not a trial.
RESTARTS = 'ctl.restarts'  # Times a trial killed by a signal was restarted.
WORKDIR = 'ctl.workdir'  # The trial's workdir, for optuna-dashboard's reader.
SEED = 'ctl.seed'  # The trial's config.seed, where the search chose it.
# A trial killed by a signal (the kernel's OOM killer, a user's kill -9)
# is restarted from its checkpoint this many times in all, by whichever
# sweep process runs it; killed once more, it is FAIL.
MAX_RESTARTS = 3
PRUNED_STATE = optuna.trial.TrialState.PRUNED
FAIL_STATE = optuna.trial.TrialState.FAIL
# After writing its claim on a trial, a sweep process reads it back this
# much later: of two processes claiming at once, the later write wins.
_CLAIM_SETTLE_SECONDS = 2.0


def storage_url(flag: str, workdir: str) -> str:
  """The study's storage: --storage, or the journal file in the workdir."""
  if flag:
    if flag.startswith('postgresql://'):  # SQLAlchemy's default is psycopg2.
      return 'postgresql+psycopg://' + flag[len('postgresql://'):]
    return flag
  if '://' in workdir:
    raise errors.ConfigError(
        f'A search in --workdir={workdir} needs --storage=postgresql://...: '
        'its default, a journal file in the workdir, needs a filesystem.')
  return os.path.abspath(os.path.join(workdir, JOURNAL_FILE))


class _GridSampler(optuna.samplers.GridSampler):
  """Optuna's GridSampler, without the study.stop() it calls once every
  point was asked for: that works only inside Study.optimize, and a sweep
  counts its trials itself (num_trials, at most the grid's size)."""

  def after_trial(self, study, trial, state, values) -> None:
    del study, trial, state, values


def make_sampler(search: hyper.Search, seed: int) -> optuna.samplers.BaseSampler:
  """The Optuna sampler a Search names, seeded, with its sampler_options."""
  options = dict(search.sampler_options)
  if search.sampler == 'grid':
    return _GridSampler(
        {key: list(distribution.values)
         for key, distribution in search.space.items()}, seed=seed, **options)
  if search.sampler == 'random':
    return optuna.samplers.RandomSampler(seed=seed, **options)
  if search.sampler == 'gp':
    return gaussian_process.GPSampler(seed=seed, **options)
  return optuna.samplers.TPESampler(seed=seed, **options)


def trial_seed(seed: int, number: int) -> int:
  """Trial `number`'s seed (its sampler's and config.seed): (Search.seed,
  number) mixed, so that searches of nearby seeds draw unrelated trials
  (0.2.0's seed + number made search 1's trial k search 0's trial k + 1)."""
  return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


def seed_trial(search: hyper.Search, trial) -> dict[str, int]:
  """{'seed': ...}: a new trial's own config.seed, kept in the study, so that
  each trial starts from weights and an order of examples of its own, as in
  Optuna in one process or Keras Tuner; {} where the search sets 'seed'."""
  if 'seed' in search.fixed or 'seed' in search.space:
    return {}
  trial.set_user_attr(SEED, trial_seed(search.seed, trial.number))
  return kept_seed(trial)


def kept_seed(trial) -> dict[str, int]:
  """The trial's {'seed': ...} from seed_trial ({} in a 0.2.0 study)."""
  seed = trial.user_attrs.get(SEED)
  return {} if seed is None else {'seed': seed}


def draw(study: optuna.Study, search: hyper.Search, trial) -> dict[str, Any]:
  """A new trial's own seed (seed_trial) and values (sample), in the study."""
  return {**seed_trial(search, trial), **sample(study, search, trial)}


def drawn(study: optuna.Study, search: hyper.Search,
          frozen: optuna.trial.FrozenTrial) -> optuna.trial.FrozenTrial:
  """A RUNNING trial to take over, with its seed and values: drawn now where
  its sweep process died between asking for it and drawing them all (it
  never started, so it starts as a new trial would)."""
  if all(key in frozen.params for key in search.space):
    return frozen
  draw(study, search, optuna.trial.Trial(study, frozen._trial_id))  # pylint: disable=protected-access
  return study._storage.get_trial(frozen._trial_id)  # pylint: disable=protected-access


def sample(study: optuna.Study, search: hyper.Search,
           trial: optuna.Trial) -> dict[str, Any]:
  """A new trial's values of the search's space, as its sampler draws them."""
  if search.sampler != 'grid':
    # Seeded by the trial's number: a study run by one process samples the
    # same values every time, and two processes asking at once differ. (A
    # grid's point was picked in ask(), by an index into the grid as
    # Search.seed shuffled it, the same in every process.)
    study.sampler = make_sampler(search, trial_seed(search.seed, trial.number))
  return {key: distribution.suggest(trial, key)
          for key, distribution in search.space.items()}


def try_sampler(search: hyper.Search) -> None:
  """Samples the search's first trials in a study in memory, as its study
  will: Optuna refuses some sampler options only when it samples
  (n_startup_trials='3')."""
  study = optuna.create_study(sampler=make_sampler(search, search.seed))
  for _ in range(min(2, search.num_trials)):
    trial = study.ask()
    sample(study, search, trial)
    study.tell(trial, 0.0)


def describe(sweep: hyper.Sweep) -> dict[str, Any]:
  """What must agree between every sweep process of one study."""
  search = sweep.search
  return {**search.description(), 'metric': sweep.metric, 'mode': sweep.mode,
          'sampler': search.sampler,
          'sampler_options': dict(sorted(search.sampler_options.items())),
          'pruner': search.pruner,
          'pruner_options': dict(sorted(search.pruner_options.items()))}


# Fields a study's description gained after a release wrote it: a study of
# that release has them at these values, and sweep files as they were then
# keep joining it.
_ADDED_FIELDS = {'sampler_options': {}}  # After 0.2.0.


def differences(study_has: dict[str, Any], file_has: dict[str, Any]) -> list[str]:
  """The fields where two descriptions differ, one line each."""
  lines = []
  for field in sorted(study_has.keys() | file_has.keys()):
    there, here = study_has.get(field), file_has.get(field)
    if isinstance(there, dict) and isinstance(here, dict):
      for key in sorted(there.keys() | here.keys()):
        if there.get(key) != here.get(key):
          lines.append(f'{field} {key!r}: {there.get(key, "absent")} in the '
                       f'study, {here.get(key, "absent")} in the sweep file')
    elif there != here:
      lines.append(f'{field}: {there!r} in the study, {here!r} in the sweep '
                   'file')
  return lines


def open_study(sweep: hyper.Sweep, url: str, name: str) -> optuna.Study:
  """Creates the study, or joins it if it exists with the same search.

  Raises:
    CtlError: the storage does not answer (exit 1).
    ConfigError: the study exists with another search (exit 2).
  """
  storage = studies.open_storage(url)
  search = sweep.search
  try:
    study = optuna.create_study(
        storage=storage, study_name=name, load_if_exists=True,
        direction='maximize' if sweep.mode == 'max' else 'minimize',
        sampler=make_sampler(search, search.seed),
        pruner=studies.make_pruner(search.pruner, dict(search.pruner_options)))
  except Exception as error:  # pylint: disable=broad-except
    raise studies.unreachable(url, error) from error
  wanted = describe(sweep)
  existing = study.user_attrs.get(studies.SEARCH)
  if existing is None:
    study.set_user_attr(studies.SEARCH, wanted)
    existing = wanted
  existing = {**_ADDED_FIELDS, **existing}
  if existing != wanted:
    raise errors.ConfigError(
        f'The study {name!r} in {studies.shown(url)} searches another space '
        'than this sweep file:\n  ' + '\n  '.join(differences(existing, wanted)) +
        '\nUse another --workdir (or --study), or the sweep file the study '
        'was started with.')
  _name_metric(study, sweep.metric)
  return study


def _name_metric(study: optuna.Study, metric: str) -> None:
  """Names the study's objective after the sweep's metric, so that
  optuna-dashboard shows 'eval.accuracy', not 'Objective 0' (a study of
  0.2.0, which has no name, gets it)."""
  with warnings.catch_warnings():  # Optuna calls this API experimental.
    warnings.simplefilter('ignore', optuna.exceptions.ExperimentalWarning)
    if study.metric_names != [metric]:
      study.set_metric_names([metric])


def trial_name(number: int) -> str:
  """A trial's workdir name: trial-0007."""
  return f'trial-{number:04d}'


@dataclasses.dataclass
class Leases:
  """This process's leases on trials: claimed, renewed, released."""

  study: optuna.Study
  lease_seconds: float
  owner: str = dataclasses.field(
      default_factory=lambda: f'{socket.gethostname()}:{os.getpid()}:'
                              f'{uuid.uuid4().hex[:8]}')

  def _write(self, frozen: optuna.trial.FrozenTrial, holder: str | None) -> None:
    self.study._storage.set_trial_user_attr(  # pylint: disable=protected-access
        frozen._trial_id, LEASE,  # pylint: disable=protected-access
        {'owner': holder, 'renewed': time.time()})

  def hold(self, frozen: optuna.trial.FrozenTrial) -> None:
    """Takes or renews the lease of a trial this process runs."""
    self._write(frozen, self.owner)

  def release(self, frozen: optuna.trial.FrozenTrial) -> None:
    """Lets any sweep process take the trial over at once."""
    self._write(frozen, None)

  def held_by_me(self, number: int) -> bool:
    """Whether this process still holds the lease of trial `number`."""
    frozen = self.study._storage.get_trial(  # pylint: disable=protected-access
        studies.trial_id(self.study, number))
    return (frozen.user_attrs.get(LEASE) or {}).get('owner') == self.owner

  def is_free(self, frozen: optuna.trial.FrozenTrial) -> bool:
    """Whether nobody runs this RUNNING trial (its lease lapsed)."""
    lease = frozen.user_attrs.get(LEASE)
    if lease is None:  # Asked for, not yet leased: its asker is on it.
      started = frozen.datetime_start.timestamp()
      return time.time() - started > self.lease_seconds
    holder = lease['owner']
    if holder is None or time.time() - lease['renewed'] > self.lease_seconds:
      return True
    host, pid, _ = holder.split(':')
    return host == socket.gethostname() and not _alive(int(pid))

  def claim(self, frozen: optuna.trial.FrozenTrial) -> bool:
    """Takes over a free trial; False if another process took it first."""
    self.hold(frozen)
    time.sleep(_CLAIM_SETTLE_SECONDS)
    return self.held_by_me(frozen.number)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True
