"""A Gaussian-process sampler for small budgets: Search(sampler='gp').

Optuna's own GPSampler needs PyTorch; this one needs only numpy, which
TensorFlow brings. It does what Keras Tuner's BayesianOptimization does,
as an Optuna sampler, so that a sweep's study, storage, takeover and
pruners stay as they are:
  - the first n_startup_trials (3 per key of the space, as Keras Tuner)
    are sampled at random;
  - then each trial fits a GP (Matern 5/2, its length scale and noise the
    likeliest of a small grid) to the trials so far, the space scaled to
    the unit cube (log-scaled where the distribution is; a `choice` one-hot),
    and takes the candidate of highest expected improvement, candidates
    drawn at random and around the best trials.
It is fitted to the latest 300 trials at most, so that a trial's sampling
takes a bounded time however long the study. A pruned trial (or one of an
infinite value) counts at the worst value of the complete ones (it was
stopped for doing worse than them; its partly trained value would make
the rest look alike), and so does a trial still running (a constant liar,
as TPE's constant_liar), so that parallel slots spread out.
The sampler keeps no state between trials: a sweep makes one per trial.
"""

import math
from typing import Any, Sequence

import numpy as np

from ctl.runtime import studies

optuna = studies.import_optuna()
dist = optuna.distributions

_LENGTH_SCALES = (0.1, 0.2, 0.4, 0.8, 1.6)
_NOISES = (1e-4, 1e-2, 1e-1)
# The latest trials the GP is fitted to: its cost grows with their cube.
_MOST_TRIALS = 300
_ERF = np.vectorize(math.erf, otypes=[float])
_STATES = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
           optuna.trial.TrialState.RUNNING)


class GPSampler(optuna.samplers.BaseSampler):
  """Bayesian optimization with a Gaussian process and expected improvement.

  Args:
    seed: seeds the random startup trials and the candidates.
    n_startup_trials: trials sampled at random before the GP takes over;
      None: 3 per key of the space (Keras Tuner's default).
    n_candidates: points scored by expected improvement for each trial.
  """

  def __init__(self, seed: int | None = None,
               n_startup_trials: int | None = None, n_candidates: int = 2048):
    if n_startup_trials is not None and (
        not isinstance(n_startup_trials, int) or n_startup_trials < 1):
      raise ValueError(f'n_startup_trials={n_startup_trials!r}: use an int, '
                       '1 or more.')
    if not isinstance(n_candidates, int) or n_candidates < 1:
      raise ValueError(f'n_candidates={n_candidates!r}: use an int, 1 or more.')
    self._rng = np.random.default_rng(seed)
    self._random = optuna.samplers.RandomSampler(seed=seed)
    self._n_startup_trials = n_startup_trials
    self._n_candidates = n_candidates

  def reseed_rng(self) -> None:
    self._rng = np.random.default_rng()
    self._random.reseed_rng()

  def infer_relative_search_space(self, study, trial):
    del trial
    space = optuna.search_space.intersection_search_space(
        study.get_trials(deepcopy=False, states=_STATES[:2]))
    return {name: distribution for name, distribution in space.items()
            if not distribution.single()}

  def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
    if not search_space:
      return {}
    startup = self._n_startup_trials or 3 * len(search_space)
    points, values = _observations(study, trial, search_space)
    if len(values) < startup:
      return {}
    points, values = points[-_MOST_TRIALS:], values[-_MOST_TRIALS:]
    if not np.any(np.isfinite(values)):
      return {}
    values = np.where(np.isfinite(values), values,
                      np.min(values[np.isfinite(values)]))
    return _decode(search_space, self._best_candidate(
        search_space, _encode(search_space, points), values))

  def sample_independent(self, study, trial, param_name, param_distribution):
    return self._random.sample_independent(study, trial, param_name,
                                           param_distribution)

  def _best_candidate(self, search_space, x: np.ndarray,
                      y: np.ndarray) -> np.ndarray:
    """The candidate of highest expected improvement over y's best."""
    y = (y - y.mean()) / (y.std() or 1.0)
    length_scale, noise = max(
        ((l, n) for l in _LENGTH_SCALES for n in _NOISES),
        key=lambda ln: _log_likelihood(x, y, *ln))
    candidates = np.concatenate([
        _random_points(search_space, self._n_candidates, self._rng),
        _near(x[np.argsort(-y)[:3]], search_space, self._n_candidates,
              self._rng)])
    mean, std = _predict(x, y, candidates, length_scale, noise)
    return candidates[np.argmax(_expected_improvement(mean, std, y.max()))]


def _observations(study, trial, search_space):
  """The other trials' points in the space and their values, maximized:
  NaN for a pruned trial or one still running (the caller gives them the
  worst complete value)."""
  sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
  points, values = [], []
  for other in study.get_trials(deepcopy=False, states=_STATES):
    if other.number != trial.number and search_space.keys() <= (
        other.params.keys()):
      points.append({name: other.params[name] for name in search_space})
      values.append(sign * other.value if other.state == (
          optuna.trial.TrialState.COMPLETE) else np.nan)
  return points, np.asarray(values, dtype=float)


def _columns(distribution) -> int:
  if isinstance(distribution, dist.CategoricalDistribution):
    return len(distribution.choices)
  return 1


def _encode(search_space, points: Sequence[dict]) -> np.ndarray:
  """Points as rows of the unit cube (a categorical one-hot)."""
  rows = []
  for point in points:
    row = []
    for name, distribution in search_space.items():
      value = point[name]
      if isinstance(distribution, dist.CategoricalDistribution):
        one_hot = [0.0] * len(distribution.choices)
        one_hot[distribution.choices.index(value)] = 1.0
        row.extend(one_hot)
      else:
        row.append(_to_unit(distribution, value))
    rows.append(row)
  return np.asarray(rows, dtype=float)


def _scaled_bounds(distribution) -> tuple[float, float]:
  """A numeric distribution's bounds on the scale the GP fits (log or not)."""
  low, high = distribution.low, distribution.high
  return (np.log(low), np.log(high)) if distribution.log else (low, high)


def _to_unit(distribution, value: float) -> float:
  low, high = _scaled_bounds(distribution)
  value = np.log(value) if distribution.log else value
  return float((value - low) / (high - low))


def _decode(search_space, row: np.ndarray) -> dict[str, Any]:
  """A row of the unit cube as the space's values."""
  params, column = {}, 0
  for name, distribution in search_space.items():
    width = _columns(distribution)
    cells = row[column:column + width]
    column += width
    if isinstance(distribution, dist.CategoricalDistribution):
      params[name] = distribution.choices[int(np.argmax(cells))]
      continue
    scaled_low, scaled_high = _scaled_bounds(distribution)
    value = scaled_low + float(cells[0]) * (scaled_high - scaled_low)
    value = float(np.exp(value)) if distribution.log else value
    low, high = distribution.low, distribution.high
    step = getattr(distribution, 'step', None)
    if step is not None:
      value = low + round((value - low) / step) * step
    value = min(max(value, low), high)
    params[name] = int(round(value)) if isinstance(
        distribution, dist.IntDistribution) else float(value)
  return params


def _random_points(search_space, count: int, rng) -> np.ndarray:
  """count points drawn uniformly from the unit cube (one-hot categoricals)."""
  columns = []
  for distribution in search_space.values():
    if isinstance(distribution, dist.CategoricalDistribution):
      picks = rng.integers(len(distribution.choices), size=count)
      columns.append(np.eye(len(distribution.choices))[picks])
    else:
      columns.append(rng.uniform(size=(count, 1)))
  return np.concatenate(columns, axis=1)


def _near(best: np.ndarray, search_space, count: int, rng) -> np.ndarray:
  """count points around the best rows: continuous columns moved a little,
  each categorical kept or redrawn."""
  points = best[rng.integers(len(best), size=count)].copy()
  moved = _random_points(search_space, count, rng)
  column = 0
  for distribution in search_space.values():
    width = _columns(distribution)
    if isinstance(distribution, dist.CategoricalDistribution):
      redraw = rng.uniform(size=count) < 0.2
      points[redraw, column:column + width] = moved[redraw,
                                                    column:column + width]
    else:
      points[:, column] = np.clip(
          points[:, column] + rng.normal(scale=0.05, size=count), 0.0, 1.0)
    column += width
  return points


def _matern52(a: np.ndarray, b: np.ndarray, length_scale: float) -> np.ndarray:
  distance = np.sqrt(np.maximum(
      ((a[:, None, :] - b[None, :, :])**2).sum(-1), 0.0)) / length_scale
  root5 = np.sqrt(5.0) * distance
  return (1.0 + root5 + root5**2 / 3.0) * np.exp(-root5)


def _fit(x: np.ndarray, y: np.ndarray, length_scale: float, noise: float):
  """The kernel's Cholesky factor and the weights of y."""
  kernel = _matern52(x, x, length_scale) + noise * np.eye(len(x))
  cholesky = np.linalg.cholesky(kernel)
  return cholesky, np.linalg.solve(cholesky.T, np.linalg.solve(cholesky, y))


def _log_likelihood(x: np.ndarray, y: np.ndarray, length_scale: float,
                    noise: float) -> float:
  """The GP's log marginal likelihood of y (less its constant)."""
  cholesky, alpha = _fit(x, y, length_scale, noise)
  return float(-0.5 * y @ alpha - np.log(np.diag(cholesky)).sum())


def _predict(x, y, candidates, length_scale: float, noise: float):
  """The GP's mean and standard deviation at the candidates."""
  cholesky, alpha = _fit(x, y, length_scale, noise)
  cross = _matern52(candidates, x, length_scale)
  mean = cross @ alpha
  v = np.linalg.solve(cholesky, cross.T)
  variance = np.maximum(1.0 - (v**2).sum(0), 1e-12)
  return mean, np.sqrt(variance)


def _expected_improvement(mean, std, best: float) -> np.ndarray:
  z = (mean - best) / std
  cdf = 0.5 * (1.0 + _ERF(z / np.sqrt(2.0)))
  pdf = np.exp(-0.5 * z**2) / np.sqrt(2.0 * np.pi)
  return (mean - best) * cdf + std * pdf
