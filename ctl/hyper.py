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
them (seeded) from `log_uniform`, `uniform` and `choice`.
"""

import builtins
import dataclasses
import itertools
import math
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
  trials: Sequence[Trial]
  # What ranks the trials: a dotted path into each trial's results.json.
  metric: str = 'eval.accuracy'
  mode: str = 'max'  # 'max' or 'min'.
  # Workers per trial; more than 1 runs each trial through ctl.launch.
  num_workers: int = 1

  def __post_init__(self):
    if self.mode not in ('max', 'min'):
      raise ValueError(f"Sweep.mode must be 'max' or 'min', not {self.mode!r}")
    if not self.trials:
      raise ValueError('A sweep needs at least one trial.')


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
  """Draws one value from a numpy Generator."""

  def sample(self, rng: np.random.Generator) -> Any:
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class uniform(Distribution):  # pylint: disable=invalid-name
  """A float uniformly in [low, high)."""

  low: float
  high: float

  def sample(self, rng):
    return float(rng.uniform(self.low, self.high))


@dataclasses.dataclass(frozen=True)
class log_uniform(Distribution):  # pylint: disable=invalid-name
  """A float whose logarithm is uniform: for learning rates and the like."""

  low: float
  high: float

  def sample(self, rng):
    return float(math.exp(rng.uniform(math.log(self.low),
                                      math.log(self.high))))


@dataclasses.dataclass(frozen=True)
class choice(Distribution):  # pylint: disable=invalid-name
  """One of the values, each equally likely."""

  values: Sequence[Any]

  def sample(self, rng):
    return self.values[int(rng.integers(len(self.values)))]


def _merge(trials: Sequence[Trial]) -> Trial:
  merged = {}
  for trial in trials:
    repeated = merged.keys() & trial.keys()
    if repeated:
      raise ValueError(f'Key(s) {sorted(repeated)} set by two factors.')
    merged.update(trial)
  return merged
