"""Search(sampler='gp'): ctl's Gaussian-process sampler, as a sweep makes it."""

import math

import numpy as np
import pytest

from ctl import hyper
from ctl.runtime import studies
from ctl.sweep import study as study_lib

optuna = studies.import_optuna()
optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {'optimizer.learning_rate': hyper.log_uniform(1e-5, 3e-2),
         'model.width': hyper.choice([32, 64, 128])}


def _narrow_peak(values: dict) -> float:
  """Highest (0.1) at a learning rate of 0.01 and width 128, falling fast."""
  return -3 * (math.log10(values['optimizer.learning_rate']) + 2)**2 + {
      32: -0.3, 64: 0.0, 128: 0.1}[values['model.width']]


def _best_of_search(sampler: str, seed: int, num_trials: int = 16) -> float:
  """The best value of a search of num_trials, each trial's values sampled
  as a sweep samples them (a sampler made per trial, seeded by
  study.trial_seed(seed, N))."""
  search = hyper.Search(space=SPACE, num_trials=num_trials, sampler=sampler,
                        pruner=None, seed=seed)
  study = optuna.create_study(direction='maximize')
  for _ in range(num_trials):
    trial = study.ask()
    study.tell(trial, _narrow_peak(study_lib.sample(study, search, trial)))
  return study.best_value


def test_the_gp_sampler_finds_a_narrow_peak_tpe_and_random_search_miss():
  # 16 trials, as benchmarks/search.py's search; seeds far apart (chosen
  # when a sweep seeded trial N's sampler with seed + N).
  seeds = [1000 * index for index in range(5)]
  best = {sampler: sorted(_best_of_search(sampler, seed) for seed in seeds)
          for sampler in ('gp', 'tpe', 'random')}
  # Its median within 0.01 of the peak, the others' below; its worst seed
  # above their medians.
  assert best['gp'][2] > 0.09, best
  assert best['tpe'][2] < 0.09 and best['random'][2] < 0.09, best
  assert best['gp'][0] > max(best['tpe'][2], best['random'][2]), best


def _next_point(states: list[str]) -> float:
  """The value the GP sampler takes for a trial after three COMPLETE ones
  (0.9 at 0.5, the best, and lower at 0.2 and 0.8) and trials at 0.5 in
  the given states (a PRUNED one having reported 0.95)."""
  search = hyper.Search(space={'x': hyper.uniform(0.0, 1.0)}, num_trials=10,
                        sampler='gp', sampler_options={'n_startup_trials': 3},
                        seed=3)
  study = optuna.create_study(direction='maximize')
  space = {'x': optuna.distributions.FloatDistribution(0.0, 1.0)}
  for x, state, value in [(0.2, 'COMPLETE', 0.5), (0.5, 'COMPLETE', 0.9),
                          (0.8, 'COMPLETE', 0.4),
                          *[(0.5, state, None) for state in states]]:
    study.add_trial(optuna.trial.create_trial(
        params={'x': x}, distributions=space,
        state=optuna.trial.TrialState[state], value=value,
        intermediate_values={0: 0.95} if state == 'PRUNED' else None))
  trial = study.ask()
  return study_lib.sample(study, search, trial)['x']


def test_trials_running_or_pruned_count_as_the_worst_so_the_next_moves_away():
  alone = _next_point([])
  assert abs(alone - 0.5) < 0.15, alone  # Beside the best.
  # A trial running at the best point (another slot's): counted as the
  # worst, the next trial goes elsewhere, not to the same point.
  assert abs(_next_point(['RUNNING']) - 0.5) > abs(alone - 0.5)
  # A pruned trial's reported 0.95 is not taken as a result better than
  # the complete trials': it counts as the worst too.
  assert abs(_next_point(['PRUNED']) - 0.5) > abs(alone - 0.5)


def test_every_kind_of_distribution_is_sampled_inside_its_bounds_and_steps():
  search = hyper.Search(
      space={'a': hyper.log_uniform(1e-4, 1.0), 'b': hyper.uniform(-1.0, 1.0),
             'c': hyper.integer(2, 9), 'd': hyper.choice(['x', 'y', None]),
             'e': hyper.choice([True, False])},
      num_trials=20, sampler='gp', sampler_options={'n_startup_trials': 2},
      pruner=None, seed=11)
  study = optuna.create_study(direction='minimize')
  sampled = []
  for _ in range(search.num_trials):
    trial = study.ask()
    values = study_lib.sample(study, search, trial)
    sampled.append(values)
    study.tell(trial, (values['a'] - 0.01)**2 + values['b']**2 + values['c'])
  for values in sampled:
    assert 1e-4 <= values['a'] <= 1.0 and -1.0 <= values['b'] <= 1.0
    assert isinstance(values['c'], int) and 2 <= values['c'] <= 9
    assert values['d'] in ('x', 'y', None) and values['e'] in (True, False)
  # After the two random trials the GP's picks follow the objective down.
  assert min(values['c'] for values in sampled[2:]) == 2


@pytest.mark.parametrize('options, message', [
    ({'n_startup_trials': 0}, 'n_startup_trials=0: use an int, 1 or more'),
    ({'n_candidates': 'many'}, "n_candidates='many': use an int"),
    ({'n_startup_trial': 3}, "unexpected keyword argument 'n_startup_trial'"),
])
def test_options_the_gp_sampler_refuses_are_named(options, message):
  search = hyper.Search(space=SPACE, num_trials=2, sampler='gp',
                        sampler_options=options)
  with pytest.raises((ValueError, TypeError), match=message):
    study_lib.make_sampler(search, 0)


def test_infinite_values_and_a_long_study_are_sampled_from():
  # 400 trials (the GP takes the latest 300), two of them infinite: the
  # sampler neither fails nor gives up on the GP.
  search = hyper.Search(space={'x': hyper.uniform(0.0, 1.0)}, num_trials=500,
                        sampler='gp', seed=5)
  study = optuna.create_study(direction='maximize')
  space = {'x': optuna.distributions.FloatDistribution(0.0, 1.0)}
  study.add_trials([optuna.trial.create_trial(
      params={'x': x}, distributions=space,
      value=-(x - 0.3)**2) for x in [0.9] * 100 + list(
          np.random.default_rng(0).uniform(size=298))])
  study.add_trials([optuna.trial.create_trial(
      params={'x': x}, distributions=space, value=value)
                    for x, value in [(0.95, float('inf')),
                                     (0.97, float('-inf'))]])
  trial = study.ask()
  assert abs(study_lib.sample(study, search, trial)['x'] - 0.3) < 0.05


def test_a_study_whose_latest_300_trials_were_pruned_samples_at_random():
  search = hyper.Search(space={'x': hyper.uniform(0.0, 1.0)}, num_trials=400,
                        sampler='gp', seed=2)
  study = optuna.create_study(direction='maximize')
  space = {'x': optuna.distributions.FloatDistribution(0.0, 1.0)}
  study.add_trials(
      [optuna.trial.create_trial(params={'x': 0.5}, distributions=space,
                                 value=1.0)] * 5 +
      [optuna.trial.create_trial(params={'x': 0.1}, distributions=space,
                                 state=optuna.trial.TrialState.PRUNED,
                                 intermediate_values={0: 0.1})] * 300)
  trial = study.ask()
  assert 0.0 <= study_lib.sample(study, search, trial)['x'] <= 1.0
