"""Sweeps as data: trials are dicts of dotted config keys to values.

A sweep file in experiments/ defines `get_sweep()` returning a `Sweep`:

    from ctl import hyper

    def get_sweep():
      return hyper.Sweep(
          config='../configs/digits.py',
          trials=hyper.product(
              hyper.sweep('optimizer.learning_rate', [1e-3, 3e-3, 1e-2]),
              hyper.sweep('batch_size', [32, 64])))

`product` crosses factors (a grid), `zip` pairs them up, `random` samples
them (seeded) from `log_uniform`, `uniform`, `integer` and `choice`.

A search instead asks an Optuna study for each trial's values, given the
same distributions as a space, a sampler, a pruner and a budget:

    def get_sweep():
      return hyper.Sweep(
          config='../configs/digits.py',
          search=hyper.Search(
              space={'optimizer.learning_rate': hyper.log_uniform(1e-4, 1e-1)},
              num_trials=12, sampler='tpe', pruner='median'))

(ctl/sweep/study.py runs it; Optuna is the extra ctl[sweep].)
"""

import builtins
import dataclasses
import itertools
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Trial = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A base config and the overrides of each trial."""

  # The config file, relative to the sweep file's directory; ':arg' after it
  # is passed to get_config as on the command line.
  config: str
  # The trials' overrides (a grid, zip or random sample); or, instead, a
  # search that an Optuna study samples.
  trials: Sequence[Trial] = ()
  # What ranks the trials: a dotted path into each trial's results.json.
  metric: str = 'eval.accuracy'
  mode: str = 'max'  # 'max' or 'min'.
  # Workers per trial; more than 1 runs each trial through ctl.launch.
  num_workers: int = 1
  search: 'Search | None' = None

  def __post_init__(self):
    if not isinstance(self.config, str) or not self.config:
      raise ValueError(f'Sweep.config={self.config!r}: name the config file, '
                       'relative to the sweep file.')
    if not isinstance(self.metric, str) or not self.metric:
      raise ValueError(f'Sweep.metric={self.metric!r}: name a result, e.g. '
                       "'eval.accuracy'.")
    if self.mode not in ('max', 'min'):
      raise ValueError(f"Sweep.mode must be 'max' or 'min', not {self.mode!r}")
    if not _is_int(self.num_workers) or self.num_workers < 1:
      raise ValueError(f'Sweep.num_workers={self.num_workers!r}: use an int, '
                       '1 or more (the workers of each trial).')
    _check_trials(self.trials)
    if self.search is not None and not isinstance(self.search, Search):
      raise ValueError(f'Sweep.search is {type(self.search).__name__}: use '
                       'hyper.Search(...).')
    if self.search is not None and self.trials:
      raise ValueError('A sweep has trials or a search, not both.')
    if not self.trials and self.search is None:
      raise ValueError('A sweep needs at least one trial, or a search.')


SAMPLERS = ('tpe', 'gp', 'random', 'grid')
PRUNERS = (None, 'median', 'asha', 'hyperband')


@dataclasses.dataclass(frozen=True)
class Search:
  """A search: each trial's values sampled by an Optuna study.

  Attributes:
    space: dotted config keys -> distributions (`log_uniform`, `uniform`,
      `integer`, `choice`).
    num_trials: the budget: trials started in the study, all sweep
      processes together (finished, pruned and failed ones count).
    sampler: 'tpe' (Optuna's TPESampler), 'gp' (a Gaussian process, as
      Keras Tuner's BayesianOptimization: ctl/sweep/gaussian_process.py;
      for budgets of tens of trials), 'random', or 'grid' (every
      combination of `choice` values, in a seeded order; num_trials at most
      their number).
    sampler_options: keyword arguments of the sampler's Optuna class, e.g.
      {'n_startup_trials': 4, 'multivariate': True, 'constant_liar': True}
      for 'tpe' (constant_liar: trials still running count as bad ones, so
      parallel trials spread out; Optuna 5 turns it and multivariate on by
      default, Optuna 4 off); the seed is Search.seed.
    pruner: None, 'median' (MedianPruner), 'asha' (SuccessiveHalvingPruner)
      or 'hyperband' (HyperbandPruner): it decides after each evaluation
      whether a trial stops early (PRUNED).
    pruner_options: keyword arguments of the pruner's Optuna class, e.g.
      {'n_startup_trials': 3} for 'median'.
    seed: seeds the sampler, and each trial's own config.seed (unless
      `fixed` or `space` has 'seed').
    fixed: overrides every trial has (not searched), e.g. {'num_epochs': 5}.
  """

  space: Mapping[str, 'Distribution']
  num_trials: int
  sampler: str = 'tpe'
  pruner: str | None = 'median'
  pruner_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  seed: int = 0
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  sampler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    _check_keys('Search.space', self.space)
    _check_keys('Search.fixed', self.fixed)
    _check_keys('Search.pruner_options', self.pruner_options)
    _check_sampler_options(self.sampler_options)
    if not self.space:
      raise ValueError('Search.space needs at least one key.')
    for key, distribution in self.space.items():
      if not isinstance(distribution, Distribution):
        raise ValueError(
            f'Search.space[{key!r}] is {distribution!r}: use hyper.log_uniform, '
            'uniform, integer or choice (a fixed value goes in Search.fixed).')
    if not _is_int(self.num_trials) or self.num_trials < 1:
      raise ValueError(f'Search.num_trials={self.num_trials!r}: use an int, 1 '
                       'or more.')
    if not _is_int(self.seed) or not 0 <= self.seed < 2**32:
      raise ValueError(f'Search.seed={self.seed!r}: use an int from 0 to '
                       f'{2**32 - 1}.')
    if self.sampler not in SAMPLERS:
      raise ValueError(f'Search.sampler={self.sampler!r}: use one of {SAMPLERS}.')
    if self.pruner not in PRUNERS:
      raise ValueError(f'Search.pruner={self.pruner!r}: use one of {PRUNERS}.')
    for key, distribution in self.space.items():
      if isinstance(distribution, choice) and not all(
          value is None or isinstance(value, (bool, int, float, str))
          for value in distribution.values):
        raise ValueError(
            f'Search.space[{key!r}]: a study stores None, bool, int, float '
            f'and str values; {distribution.values!r} has others.')
    if self.sampler == 'grid':
      if not all(isinstance(d, choice) for d in self.space.values()):
        raise ValueError("Search.sampler='grid' needs hyper.choice for every "
                         'key of the space.')
      size = math.prod(len(d.values) for d in self.space.values())
      if self.num_trials > size:
        raise ValueError(f'Search.num_trials={self.num_trials}: the grid has '
                         f'{size} points; use at most that many.')
    repeated = self.space.keys() & self.fixed.keys()
    if repeated:
      raise ValueError(f'Key(s) {sorted(repeated)} both searched and fixed.')

  def description(self) -> dict[str, Any]:
    """What makes two sweep processes' searches one study (JSON-able)."""
    return {'space': {key: repr(distribution)
                      for key, distribution in sorted(self.space.items())},
            'fixed': {key: repr(value)
                      for key, value in sorted(self.fixed.items())}}


def sweep(key: str, values: Sequence[Any]) -> list[Trial]:
  """One factor: [{key: value} for each value]."""
  return [{key: value} for value in values]


def fixed(overrides: Mapping[str, Any]) -> list[Trial]:
  """A factor of one trial: the same overrides for every trial it meets."""
  return [dict(overrides)]


def product(*factors: Sequence[Trial]) -> list[Trial]:
  """Every combination of the factors' trials (a grid), the last varying fastest."""
  return [_merge(combination) for combination in itertools.product(*factors)]


def zip(*factors: Sequence[Trial]) -> list[Trial]:  # pylint: disable=redefined-builtin
  """The i-th trials of the factors merged; factors must be equally long."""
  lengths = {len(factor) for factor in factors}
  if len(lengths) > 1:
    raise ValueError(f'zip needs factors of one length, got {sorted(lengths)}')
  return [_merge(combination) for combination in builtins.zip(*factors)]


def random(num_trials: int, seed: int,
           distributions: Mapping[str, 'Distribution']) -> list[Trial]:
  """num_trials trials, each key drawn from its distribution (seeded)."""
  rng = np.random.default_rng(seed)
  return [{key: distribution.sample(rng)
           for key, distribution in distributions.items()}
          for _ in range(num_trials)]


class Distribution:
  """Draws one value from a numpy Generator, or asks an Optuna trial for it."""

  def sample(self, rng: np.random.Generator) -> Any:
    raise NotImplementedError

  def suggest(self, trial: Any, key: str) -> Any:
    """The value an optuna.Trial suggests for key."""
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class uniform(Distribution):  # pylint: disable=invalid-name
  """A float uniformly in [low, high)."""

  low: float
  high: float

  def __post_init__(self):
    _check_bounds(self, numbers.Real)

  def sample(self, rng):
    return float(rng.uniform(self.low, self.high))

  def suggest(self, trial, key):
    return trial.suggest_float(key, self.low, self.high)


@dataclasses.dataclass(frozen=True)
class log_uniform(Distribution):  # pylint: disable=invalid-name
  """A float whose logarithm is uniform: for learning rates and the like."""

  low: float
  high: float

  def __post_init__(self):
    _check_bounds(self, numbers.Real)
    if self.low <= 0:
      raise ValueError(f'hyper.{self!r}: a log scale needs low > 0.')

  def sample(self, rng):
    return float(math.exp(rng.uniform(math.log(self.low),
                                      math.log(self.high))))

  def suggest(self, trial, key):
    return trial.suggest_float(key, self.low, self.high, log=True)


@dataclasses.dataclass(frozen=True)
class integer(Distribution):  # pylint: disable=invalid-name
  """An int uniformly in [low, high], both included."""

  low: int
  high: int

  def __post_init__(self):
    _check_bounds(self, numbers.Integral)

  def sample(self, rng):
    return int(rng.integers(self.low, self.high + 1))

  def suggest(self, trial, key):
    return trial.suggest_int(key, self.low, self.high)


@dataclasses.dataclass(frozen=True)
class choice(Distribution):  # pylint: disable=invalid-name
  """One of the values, each equally likely."""

  values: Sequence[Any]

  def __post_init__(self):
    if (isinstance(self.values, (str, bytes)) or
        not isinstance(self.values, Sequence) or not self.values):
      raise ValueError(f'hyper.choice({self.values!r}): give a list of one '
                       'or more values.')

  def sample(self, rng):
    return self.values[int(rng.integers(len(self.values)))]

  def suggest(self, trial, key):
    return trial.suggest_categorical(key, list(self.values))


def _check_bounds(distribution: Distribution, kind: type) -> None:
  """Refuses the bounds a distribution cannot draw from: Optuna's rules,
  so a search fails before its study has a trial it cannot sample."""
  for bound in (distribution.low, distribution.high):
    if (isinstance(bound, bool) or not isinstance(bound, kind) or
        (kind is numbers.Real and not math.isfinite(bound))):
      what = 'ints' if kind is numbers.Integral else 'finite numbers'
      raise ValueError(f'hyper.{distribution!r}: its bounds must be {what}.')
  if distribution.low > distribution.high:
    raise ValueError(
        f'hyper.{distribution!r}: low is above high; write '
        f'hyper.{type(distribution).__name__}({distribution.high!r}, '
        f'{distribution.low!r}).')


def _check_sampler_options(options: Any) -> None:
  """Refuses sampler options a study cannot record, or that set the seed."""
  _check_keys('Search.sampler_options', options)
  for key, value in options.items():
    if key == 'seed':
      raise ValueError("Search.sampler_options sets 'seed': set Search.seed.")
    if not (value is None or isinstance(value, (bool, int, float, str))):
      raise ValueError(
          f'Search.sampler_options[{key!r}] is {value!r}: a study records '
          'None, bool, int, float and str values.')


def _check_trials(trials: Any) -> None:
  """Refuses Sweep.trials that is not a list of override dicts."""
  if isinstance(trials, (str, bytes)) or not isinstance(trials, Sequence):
    raise ValueError(f'Sweep.trials is {type(trials).__name__}: use a list '
                     'of override dicts (hyper.product, zip, random).')
  for index, trial in enumerate(trials):
    _check_keys(f'Sweep.trials[{index}]', trial)


def _check_keys(what: str, mapping: Any) -> None:
  """Refuses a mapping that is not a dict keyed by strings."""
  if not isinstance(mapping, Mapping):
    raise ValueError(f'{what} is {type(mapping).__name__}: use a dict.')
  for key in mapping:
    if not isinstance(key, str):
      raise ValueError(f'{what} has the key {key!r}: use string keys.')


def _is_int(value: Any) -> bool:
  """Whether value is an int, not a bool (which Python counts as one)."""
  return isinstance(value, int) and not isinstance(value, bool)


def _merge(trials: Sequence[Trial]) -> Trial:
  merged = {}
  for trial in trials:
    repeated = merged.keys() & trial.keys()
    if repeated:
      raise ValueError(f'Key(s) {sorted(repeated)} set by two factors.')
    merged.update(trial)
  return merged
