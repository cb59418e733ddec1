"""Searches: an Optuna study shared by sweep processes, pruning, trials
taken over after a SIGKILL, against the embedded journal file and a real
PostgreSQL server."""

import csv
import json
import os
import pathlib
import random
import re
import signal
import sys
import time
import uuid

import numpy as np
import pytest

from ctl import config as config_lib
from ctl import errors
from ctl import hyper
from ctl.runtime import studies
from ctl.sweep import search as search_lib
from ctl.sweep import study as study_lib
from ctl.sweep import trials as trials_lib
import helpers

# Two epochs of 22 steps, evaluated every 11: four reports a trial.
SHORT = {'num_epochs': 2, 'batch_size': 64, 'intervals.eval_steps': 11}


def _write_sweep(path: pathlib.Path, search: str) -> str:
  path.write_text(
      'from ctl import hyper\n\n'
      'def get_sweep():\n'
      f'  return hyper.Sweep(config={helpers.DIGITS!r}, search={search},\n'
      '                     metric="eval.accuracy", mode="max")\n')
  return str(path)


def _write_own_task_search(path: pathlib.Path, metric: str, num_trials: int = 2,
                           num_workers: int = 1) -> str:
  """A search over tests/configs/noisy_regression.py (a config from
  ctl.base_config(), its eval results its own: mae, mse): tiny trials."""
  config = helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py'
  # One epoch of 16 steps, evaluated every 8: two reports a trial.
  path.write_text(
      'from ctl import hyper\n\n'
      'def get_sweep():\n'
      f'  return hyper.Sweep(config={str(config)!r}, search=hyper.Search(\n'
      "      space={'seed': hyper.integer(0, 3)}, "
      f"num_trials={num_trials},\n"
      "      fixed={'num_epochs': 1, 'intervals.eval_steps': 8,\n"
      "             'export.at_end': False}),\n"
      f'      metric={metric!r}, mode="min", num_workers={num_workers})\n')
  return str(path)


def _command(sweep_file, workdir, storage='', *flags) -> list[str]:
  return [sys.executable, '-m', 'ctl.sweep', f'--sweep={sweep_file}',
          f'--workdir={workdir}', *([f'--storage={storage}'] if storage else []),
          *flags]


def _storage(kind: str, request) -> str:
  """'' (the journal file in the workdir), or a new PostgreSQL database."""
  if kind == 'journal':
    return ''
  server = request.getfixturevalue('postgres_server')
  return server.create_database(f'study_{uuid.uuid4().hex[:8]}')


def _study(workdir: pathlib.Path, storage: str):
  """The study, as the sweep processes left it."""
  optuna = studies.import_optuna()
  url = study_lib.storage_url(storage, str(workdir))
  return optuna.load_study(study_name=workdir.name,
                           storage=studies.open_storage(url))


def _read_csv(path: pathlib.Path) -> list[dict]:
  with open(path, newline='') as file:
    return list(csv.DictReader(file))


# Definitions.


def test_a_search_checks_its_space_sampler_and_pruner():
  space = {'optimizer.learning_rate': hyper.log_uniform(1e-4, 1e-1),
           'seed': hyper.integer(0, 3)}
  search = hyper.Search(space=space, num_trials=4)
  assert (search.sampler, search.pruner) == ('tpe', 'median')
  rng = np.random.default_rng(0)
  assert {hyper.integer(0, 3).sample(rng) for _ in range(100)} == {0, 1, 2, 3}
  with pytest.raises(ValueError, match='trials or a search, not both'):
    hyper.Sweep(config='c.py', trials=[{}], search=search)
  with pytest.raises(ValueError, match=r"Search.pruner='asap'"):
    hyper.Search(space=space, num_trials=4, pruner='asap')
  with pytest.raises(ValueError, match="'grid' needs hyper.choice"):
    hyper.Search(space=space, num_trials=4, sampler='grid')
  with pytest.raises(ValueError, match='a fixed value goes in Search.fixed'):
    hyper.Search(space={'seed': 3}, num_trials=4)
  with pytest.raises(ValueError, match=r"\['seed'\] both searched and fixed"):
    hyper.Search(space=space, num_trials=4, fixed={'seed': 1})


def test_a_search_refuses_what_its_study_could_not_sample_or_seed(tmp_path):
  space = {'optimizer.learning_rate': hyper.log_uniform(1e-4, 1e-1)}
  refused = {
      # Optuna's IndexError, and its ValueError after the study had a trial.
      r'hyper.choice\(\[\]\): give a list': lambda: hyper.Search(
          space={'model.width': hyper.choice([])}, num_trials=2),
      r'write hyper.log_uniform\(0.0001, 0.01\)': lambda: hyper.Search(
          space={'x': hyper.log_uniform(1e-2, 1e-4)}, num_trials=2),
      # Optuna's samplers take seeds from 0 to 2**32 - 1.
      r'Search.seed=-1: use an int from 0 to 4294967295':
          lambda: hyper.Search(space=space, num_trials=2, seed=-1),
      r'Search.seed=4294967296: use an int from 0 to 4294967295':
          lambda: hyper.Search(space=space, num_trials=2, seed=2**32),
      r"Search.seed='0'": lambda: hyper.Search(space=space, num_trials=2,
                                               seed='0'),
      r"Search.num_trials='2': use an int, 1 or more":
          lambda: hyper.Search(space=space, num_trials='2'),
      r'Search.pruner_options is list: use a dict': lambda: hyper.Search(
          space=space, num_trials=2, pruner_options=[('n_startup_trials', 1)]),
      r'Search.space has the key 3: use string keys':
          lambda: hyper.Search(space={3: hyper.uniform(0, 1)}, num_trials=2),
      r'Search.fixed is str: use a dict':
          lambda: hyper.Search(space=space, num_trials=2, fixed='seed=1'),
  }
  refused.update({
      r"Search.sampler_options sets 'seed': set Search.seed": lambda:
          hyper.Search(space=space, num_trials=2,
                       sampler_options={'seed': 1}),
      # It would be written into the study's description, as JSON.
      r"Search.sampler_options\['gamma'\] is <built-in function len>: a "
      'study records None, bool, int, float and str values':
          lambda: hyper.Search(space=space, num_trials=2,
                               sampler_options={'gamma': len}),
  })
  for message, make in refused.items():
    with pytest.raises(ValueError, match=message):
      make()
  # Options the sampler refuses, found by sampling as the study will: some
  # only once it samples (n_startup_trials='3' compared to a count).
  for sampler, options, message in [
      ('tpe', {'n_startup_trial': 3}, "unexpected keyword argument "
       "'n_startup_trial'"),
      ('tpe', {'n_startup_trials': '3'}, "TypeError: '<' not supported"),
      ('tpe', {'multivariate': False, 'group': True}, 'ValueError: '),
      ('random', {'n_startup_trials': 3}, 'TypeError: '),
      ('gp', {'n_startup_trials': '3'}, "ValueError: n_startup_trials='3'")]:
    sweep = hyper.Sweep(config=helpers.DIGITS, search=hyper.Search(
        space=space, num_trials=2, sampler=sampler, sampler_options=options))
    with pytest.raises(errors.ConfigError,
                       match=rf'Search.sampler_options=.* do not fit '
                       rf'sampler={sampler!r} \(seed 0\): .*{message}'):
      search_lib.check(sweep, helpers.DIGITS)
  # Options the pruner refuses, found by making it as the study will.
  for pruner, options, message in [
      ('median', {'bogus': 3}, "unexpected keyword argument 'bogus'"),
      ('median', {'n_startup_trials': -1}, 'ValueError: '),
      (None, {'n_startup_trials': 1}, 'TypeError: ')]:
    sweep = hyper.Sweep(config=helpers.DIGITS, search=hyper.Search(
        space=space, num_trials=2, pruner=pruner, pruner_options=options))
    with pytest.raises(errors.ConfigError,
                       match=rf'Search.pruner_options=.* do not fit '
                       rf'pruner={pruner!r}: .*{message}'):
      search_lib.check(sweep, helpers.DIGITS)
  assert not list(tmp_path.iterdir())


# A bad Search.seed (it was "storage does not answer", exit 1, with
# study.journal written) is refused as reversed bounds are, when
# hyper.Search is made: test_a_search_refuses_what_its_study_could_not_
# sample_or_seed checks its message.
HOSTILE_SEARCHES = {
    # Was a traceback, and the rerun made a trial COMPLETE without values.
    'reversed_bounds': (
        "{'optimizer.learning_rate': hyper.log_uniform(1e-2, 1e-4)}", '',
        'low is above high; write hyper.log_uniform(0.0001, 0.01)'),
    # Were "storage does not answer" (exit 1) with study.journal written.
    'pruner_options': (
        "{'optimizer.learning_rate': hyper.log_uniform(1e-4, 1e-2)}",
        ", pruner_options={'n_startup_trial': 3}",
        "Search.pruner_options={'n_startup_trial': 3} do not fit "
        "pruner='median': TypeError:"),
    # Would have been a traceback at the first trial's sampling.
    'sampler_options': (
        "{'optimizer.learning_rate': hyper.log_uniform(1e-4, 1e-2)}",
        ", sampler_options={'n_startup_trials': '3'}",
        "Search.sampler_options={'n_startup_trials': '3'} do not fit "
        "sampler='tpe' (seed 0): TypeError:"),
}


@pytest.mark.parametrize('case', HOSTILE_SEARCHES)
def test_a_hostile_search_is_one_line_before_anything_is_written(
    tmp_path, case):
  space, options, message = HOSTILE_SEARCHES[case]
  sweep_file = _write_sweep(tmp_path / f'{case}.py', 'hyper.Search(space='
                            f'{space}, num_trials=1{options})')
  run = helpers.Watched(_command(sweep_file, tmp_path / 'sweep'),
                        env=helpers.env_with(TF_CPP_MIN_LOG_LEVEL='3'))
  helpers.assert_sweep_refused(run, message, tmp_path / 'sweep')


def test_a_study_name_that_is_not_utf8_is_refused_before_anything_is_written(
    tmp_path):
  sweep_file = _write_sweep(tmp_path / 'search.py', 'hyper.Search(space={'
                            "'optimizer.learning_rate': hyper.uniform(0.001, "
                            '0.01)}, num_trials=1)')
  # As a shell passes --study=$'st\xff': the byte that is not UTF-8 comes
  # to Python as a surrogate. (It was a UnicodeEncodeError once
  # study.journal, sweep.json and trial-0000 were written.)
  run = helpers.Watched(_command(sweep_file, tmp_path / 'sweep', '',
                                 '--study=st\udcff'),
                        env=helpers.env_with(TF_CPP_MIN_LOG_LEVEL='3'))
  helpers.assert_sweep_refused(run, '--study=st\\xff is not UTF-8 text',
                  tmp_path / 'sweep')


@pytest.mark.slow  # Three processes that import TensorFlow.
def test_dashboard_check_runs_the_optuna_dashboard_on_path_or_says_why_not(
    tmp_path):
  command = [sys.executable,
             str(helpers.REPO / 'experiments' / 'dashboard_check.py')]
  env = helpers.env_with(TF_CPP_MIN_LOG_LEVEL='3')
  # A workdir without a study: one line, and no journal made there.
  run = helpers.Watched([*command, str(tmp_path / 'nowhere')], env=env)
  assert run.wait() == 1
  assert run.output.splitlines() == [
      f"No study journal {tmp_path}/nowhere/study.journal: give the sweep's "
      '--workdir (and its --storage, if it had one).']
  assert not (tmp_path / 'nowhere').exists()
  workdir = tmp_path / 'sweep'
  url = study_lib.storage_url('', str(workdir))
  studies.import_optuna().create_study(
      study_name='sweep', storage=studies.open_storage(url)).ask()
  # optuna-dashboard installed in another environment, only on PATH (was a
  # FileNotFoundError traceback): a stand-in that says how it was started
  # and exits 3, as one that cannot read the storage would.
  other_environment = tmp_path / 'other_environment' / 'bin'
  other_environment.mkdir(parents=True)
  dashboard = other_environment / 'optuna-dashboard'
  dashboard.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/started\nexit 3\n')
  dashboard.chmod(0o755)
  env['PATH'] = os.pathsep.join([str(other_environment), env['PATH']])
  run = helpers.Watched([*command, str(workdir)], env=env)
  assert run.wait() == 1
  assert run.output.splitlines() == ['optuna-dashboard exited with code 3']
  assert (tmp_path / 'started').read_text().split()[-3:] == [
      '--storage-class', 'JournalFileStorage', url]
  run = helpers.Watched([*command, str(workdir), '--study=other'], env=env)
  assert run.wait() == 1
  assert run.output.splitlines() == [
      f"No study 'other' in {url} (it has ['sweep']): give the sweep's "
      '--study, if it had one.']


@pytest.mark.slow  # Two sweep processes (the second from the Slurm script).
def test_a_storage_that_does_not_answer_stops_the_sweep_before_any_trial(
    tmp_path):
  sweep_file = _write_sweep(tmp_path / 'search.py', 'hyper.Search(space={'
                            "'optimizer.learning_rate': hyper.uniform(0.001, "
                            '0.01)}, num_trials=2)')
  with helpers.refusing_port() as port:
    run = helpers.Watched(_command(sweep_file, tmp_path / 'sweep',
                                   f'postgresql://ctl@127.0.0.1:{port}/study'))
    assert run.wait() == errors.EXIT_FAILURE
    errors_printed = [line for line in run.output.splitlines()
                      if line.startswith('ctl.sweep: error:')]
    assert errors_printed == [
        f'ctl.sweep: error: The study storage postgresql+psycopg://ctl@'
        f'127.0.0.1:{port}/study does not answer: OperationalError: '
        + errors_printed[0].split('OperationalError: ', 1)[-1]], run.output
    assert 'Traceback' not in run.output
    assert not (tmp_path / 'sweep').exists()
    # The Slurm array's script passes its storage on as it is.
    sbatch = helpers.REPO / 'experiments' / 'deploy' / 'sweep.sbatch'
    run = helpers.Watched(['bash', str(sbatch)], env=helpers.env_with(
        PATH=os.pathsep.join([os.path.dirname(sys.executable),
                              os.environ['PATH']]),
        SWEEP=sweep_file, WORKDIR=str(tmp_path / 'sweep'),
        STORAGE=f'postgresql://ctl@127.0.0.1:{port}/study'))
    assert run.wait() == errors.EXIT_FAILURE
    assert errors_printed[0] in run.output


@pytest.mark.slow  # Four processes that import ctl and Optuna.
def test_processes_opening_a_new_database_at_once_all_open_it(
    postgres_server, tmp_path):
  # Each creates Optuna's tables in the empty database: they race there.
  url = postgres_server.create_database(f'race_{uuid.uuid4().hex[:8]}')
  go = tmp_path / 'go'
  code = ('import os, sys, time; from ctl.runtime import studies; '
          'import optuna.storages, sqlalchemy.exc; '
          'print("ready", flush=True); deadline = time.monotonic() + 120\n'
          'while not os.path.exists(sys.argv[2]) and '
          'time.monotonic() < deadline: time.sleep(0.005)\n'
          'studies.open_storage(sys.argv[1])')
  openers = [helpers.Watched([sys.executable, '-c', code, url, str(go)])
             for _ in range(4)]
  for opener in openers:
    opener.wait_for('^ready')
  go.touch()  # All at once.
  for opener in openers:
    assert opener.wait() == 0, opener.output[-2000:]


def test_a_sweep_file_of_another_space_than_its_study_is_refused(tmp_path):
  workdir = tmp_path / 'sweep'
  first = _write_sweep(tmp_path / 'first.py', 'hyper.Search(space={'
                       "'optimizer.learning_rate': hyper.log_uniform(1e-4, "
                       "0.1), 'seed': hyper.integer(0, 3)}, num_trials=2)")
  sweep, _ = trials_lib.load_sweep(first)
  study_lib.open_study(sweep, study_lib.storage_url('', str(workdir)),
                       workdir.name)
  second = _write_sweep(tmp_path / 'second.py', 'hyper.Search(space={'
                        "'optimizer.learning_rate': hyper.log_uniform(1e-3, "
                        "0.1), 'batch_size': hyper.choice([32, 64])}, "
                        'num_trials=2)')
  run = helpers.Watched(_command(second, workdir))
  assert run.wait() == errors.EXIT_USAGE
  assert (f"ctl.sweep: error: The study 'sweep' in {workdir}/study.journal "
          'searches another space than this sweep file:') in run.output
  assert ("space 'batch_size': absent in the study, choice(values=[32, 64]) "
          'in the sweep file') in run.output
  assert ("space 'optimizer.learning_rate': log_uniform(low=0.0001, high=0.1) "
          'in the study, log_uniform(low=0.001, high=0.1) in the sweep file'
          ) in run.output
  assert "space 'seed': integer(low=0, high=3) in the study, absent" in (
      run.output)
  assert [path.name for path in workdir.iterdir()] == ['study.journal']


def _next_value(tmp_path: pathlib.Path, options: dict, last: str) -> float:
  """The learning rate ctl samples for trial 6 of a study (journal in
  tmp_path) after 3 COMPLETE trials and 3 more, all FAIL or all RUNNING,
  at the best one's value."""
  optuna = studies.import_optuna()
  search = hyper.Search(
      space={'optimizer.learning_rate': hyper.uniform(0.0, 1.0)},
      num_trials=10, seed=7, sampler_options=options)
  name = f'study_{uuid.uuid4().hex[:8]}'
  study = study_lib.open_study(
      hyper.Sweep(config=helpers.DIGITS, search=search, mode='min'),
      str(tmp_path / name / 'study.journal'), name)
  space = {'optimizer.learning_rate': optuna.distributions.FloatDistribution(
      0.0, 1.0)}
  for value, state in [(0.1, 'COMPLETE'), (0.5, 'COMPLETE'), (0.9, 'COMPLETE'),
                       *[(0.1, last)] * 3]:
    study.add_trial(optuna.trial.create_trial(
        params={'optimizer.learning_rate': value}, distributions=space,
        state=optuna.trial.TrialState[state],
        value=value if state == 'COMPLETE' else None))
  trial = study.ask()
  assert trial.number == 6
  return study_lib.sample(study, search, trial)['optimizer.learning_rate']


def test_the_sampler_options_reach_the_tpe_sampler_of_each_trial(tmp_path):
  # n_startup_trials: random values while fewer trials are COMPLETE.
  random_phase = _next_value(tmp_path, {'n_startup_trials': 10}, 'FAIL')
  assert _next_value(tmp_path, {'n_startup_trials': 4}, 'FAIL') == random_phase
  assert _next_value(tmp_path, {'n_startup_trials': 3}, 'FAIL') != random_phase
  # constant_liar: trials still RUNNING (in other processes) count, as bad
  # ones, so the next trial moves away from them; without it they are
  # ignored as FAIL ones are.
  for liar in (True, False):
    options = {'n_startup_trials': 3, 'constant_liar': liar}
    ignored = _next_value(tmp_path, options, 'FAIL')
    running = _next_value(tmp_path, options, 'RUNNING')
    assert (running != ignored) == liar, (liar, running, ignored)


def _sampled(search: hyper.Search, count: int) -> list[float]:
  """The first `count` values of 'x' a search samples, in memory."""
  study = studies.import_optuna().create_study()
  return [study_lib.sample(study, search, study.ask())['x']
          for _ in range(count)]


@pytest.mark.parametrize('sampler', ['tpe', 'random', 'gp'])
def test_searches_with_nearby_seeds_sample_unrelated_trials(sampler):
  # Each trial's sampler was seeded with seed + its number (0.2.0): search
  # 1's trial k was search 0's trial k + 1.
  searches = [_sampled(hyper.Search(space={'x': hyper.uniform(0.0, 1.0)},
                                    num_trials=8, seed=seed, sampler=sampler),
                       8) for seed in (0, 1, 2)]
  values = [value for search in searches for value in search]
  assert len(set(values)) == len(values), searches
  # And one seed samples the same trials every time.
  assert _sampled(hyper.Search(space={'x': hyper.uniform(0.0, 1.0)},
                               num_trials=8, seed=1, sampler=sampler),
                  8) == searches[1]


def test_each_trial_trains_from_a_seed_of_its_own_unless_the_search_sets_it():
  space = {'x': hyper.uniform(0.0, 1.0)}

  def seeds(search):
    study = studies.import_optuna().create_study()
    trials = [study.ask() for _ in range(16)]
    given = [study_lib.seed_trial(search, trial) for trial in trials]
    assert given == [study_lib.kept_seed(trial) for trial in trials]
    return [seed.get('seed') for seed in given]

  drawn = seeds(hyper.Search(space=space, num_trials=16))
  assert len(set(drawn)) == 16 and all(0 <= seed < 2**32 for seed in drawn)
  assert drawn == [study_lib.trial_seed(0, number) for number in range(16)]
  assert seeds(hyper.Search(space=space, num_trials=2, fixed={'seed': 3})) \
      == [None] * 16
  assert seeds(hyper.Search(space={**space, 'seed': hyper.integer(0, 3)},
                            num_trials=2)) == [None] * 16


# Real searches.

# Seed 468 samples learning rates 0.014 and 0.014 for trials 0 and 1 (run
# at once, never pruned: two trials must complete first), 2.1e-5 and 3.9e-5
# for trials 2 and 3: four trials, at least one of them pruned.
SEARCH = ("hyper.Search(space={'optimizer.learning_rate': "
          "hyper.log_uniform(1e-5, 3e-2), 'seed': hyper.integer(0, 3)}, "
          f"fixed={SHORT!r}, num_trials=4, seed=468, sampler='tpe', "
          "pruner='median', pruner_options={'n_startup_trials': 2})")


# Each storage once: processes sharing the embedded journal here, a trial
# taken over through PostgreSQL below (test_processes_opening_a_new_database_
# _at_once_all_open_it has several processes on one new database).
@pytest.fixture(scope='module', params=['journal'])
def shared_search(request, tmp_path_factory):
  """Two sweep processes started at once on one study of 4 trials."""
  tmp_path = tmp_path_factory.mktemp(f'search_{request.param}')
  storage = _storage(request.param, request)
  sweep_file = _write_sweep(tmp_path / 'search.py', SEARCH)
  workdir = tmp_path / 'sweep'
  runs = [helpers.Watched(_command(sweep_file, workdir, storage))
          for _ in range(2)]
  codes = [run.wait() for run in runs]
  assert codes == [0, 0], '\n'.join(run.output[-3000:] for run in runs)
  return workdir, storage, [run.output for run in runs]


@pytest.mark.slow
def test_two_sweep_processes_run_one_study_and_prune(shared_search):
  workdir, storage, outputs = shared_search
  started = [re.findall(r'\[sweep\] (trial-\d+): started', output)
             for output in outputs]
  assert all(started), 'each sweep process ran trials'
  names = sorted(started[0] + started[1])
  assert names == [f'trial-{number:04d}' for number in range(4)], started

  study = _study(workdir, storage)
  assert study.metric_names == ['eval.accuracy']  # Not "Objective 0".
  trials = [trial for trial in study.trials
            if not trial.user_attrs.get(study_lib.SURPLUS)]
  assert [trial.number for trial in trials] == list(range(4))
  for trial in trials:  # What optuna-dashboard shows to lead to them.
    assert trial.user_attrs[study_lib.WORKDIR] == str(
        workdir / f'trial-{trial.number:04d}')
  # Each trial sampled with a seed of its own: no two processes asking at
  # once drew the same values.
  assert len({trial.params['optimizer.learning_rate'] for trial in trials}) \
      == 4
  states = [trial.state.name for trial in trials]
  assert set(states) <= {'COMPLETE', 'PRUNED'} and 'PRUNED' in states, states
  rows = _read_csv(workdir / 'results.csv')
  assert [(row['trial'], row['state']) for row in rows] == [
      (f'trial-{trial.number:04d}', trial.state.name) for trial in trials]
  for row, trial in zip(rows, trials):
    assert float(row['optimizer.learning_rate']) == trial.params[
        'optimizer.learning_rate']
    assert 0 <= int(row['seed']) <= 3
    results = helpers.read_results(pathlib.Path(row['workdir']))
    steps = sorted(trial.intermediate_values)
    if trial.state.name == 'PRUNED':
      assert results['stopped']['reason'].startswith(
          f'pruned at step {steps[-1]}: eval accuracy'), results['stopped']
      assert row['status'] == 'pruned'
      # No search keeps a pruned trial's model: it is not exported.
      assert not (pathlib.Path(row['workdir']) / 'export').exists()
    else:
      assert steps == [11, 22, 33, 44]
      assert (pathlib.Path(row['workdir']) / 'export').is_dir()
      assert trial.value == pytest.approx(results['eval']['accuracy'])
  best = max((row for row in rows if row['state'] == 'COMPLETE'),
             key=lambda row: float(row['eval.accuracy']))
  assert f'best: {best["trial"]}' in outputs[0] + outputs[1]


# Six epochs of 22 steps, a checkpoint each epoch, an evaluation every 11;
# no export (what is compared is results.json's weights).
LONG = {'num_epochs': 6, 'batch_size': 64, 'intervals.eval_steps': 11,
        'deterministic': True, 'export.at_end': False}


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  """results.json of a run of LONG, lr 0.003, never stopped, with the seed
  a search seeded 0 gives its trial 0."""
  workdir = tmp_path_factory.mktemp('uninterrupted')
  overrides = {**LONG, 'optimizer.learning_rate': 0.003,
               'seed': study_lib.trial_seed(0, 0)}
  result = helpers.run_ctl(f'--config={helpers.DIGITS}', f'--workdir={workdir}',
                           *config_lib.override_flags(overrides))
  assert result.returncode == 0, result.stdout[-3000:]
  return helpers.read_results(workdir)


def _not_again(step: int) -> str:
  """What a resumed trial logs for an evaluation reported before it."""
  return (f'Step {step} was reported to the study before this run resumed: '
          'not again.')


# One trial killed twice, where two tests each killed one: by SIGKILL to
# the trial alone (as the kernel's OOM killer sends it) while its sweep
# process lives, which runs it again, resumed; then by SIGKILL to its sweep
# process, and another sweep process takes it over.
@pytest.mark.slow
@pytest.mark.parametrize('kind', ['postgresql'])
def test_a_killed_trial_is_restarted_and_a_dead_sweep_processes_taken_over(
    kind, request, tmp_path, uninterrupted):
  seed = random.randrange(1000)
  print(f'kill seed: {seed}')
  rng = random.Random(seed)
  # Each killed after reporting an evaluation it has no checkpoint of: the
  # resumed trial evaluates that step again.
  trial_kill_step = 22 * rng.randint(1, 2) + 11
  sweep_kill_step = trial_kill_step + 22 * rng.randint(1, 2)
  storage = _storage(kind, request)
  # One trial, not pruned, of a fixed learning rate: its weights are known.
  sweep_file = _write_sweep(tmp_path / 'search.py', (
      "hyper.Search(space={'optimizer.learning_rate': hyper.choice([0.003])},"
      f" fixed={LONG!r}, num_trials=1, sampler='grid', pruner=None)"))
  workdir = tmp_path / 'sweep'
  trial_dir = workdir / 'trial-0000'
  first = helpers.Watched(_command(sweep_file, workdir, storage))
  pid = int(first.wait_for(r'trial-0000: started \(pid (\d+)\)')[1])
  helpers.wait_for_line(
      trial_dir / 'log.txt',
      rf'Reported eval accuracy \S+ at step {trial_kill_step} ', first.process)
  os.kill(pid, signal.SIGKILL)
  first.wait_for(re.escape(
      'trial-0000: killed by SIGKILL, not by an error of its own; '
      'restarting it from its checkpoint (restart 1 of '
      f'{study_lib.MAX_RESTARTS})'))
  # Reported by the restarted trial (or, where the killed one ran on that
  # far, said not to be reported again).
  helpers.wait_for_line(
      trial_dir / 'log.txt',
      rf'Restored [\s\S]*(Reported eval accuracy \S+ at step '
      rf'{sweep_kill_step} |{re.escape(_not_again(sweep_kill_step))})',
      first.process)
  first.process.send_signal(signal.SIGKILL)
  first.wait()
  # The trial's process (a warm slot's, not naming the workdir) too.
  helpers.wait_until_gone(int(re.findall(r'trial-0000: started \(pid (\d+)\)',
                                         first.output)[-1]))
  deadline = time.monotonic() + 60
  while helpers.processes_mentioning(str(trial_dir)):  # Dies with its parent.
    assert time.monotonic() < deadline, 'the trial outlived its sweep'
    time.sleep(0.1)
  assert _study(workdir, storage).trials[0].state.name == 'RUNNING'

  taken_over = ('trial-0000: taken over (nobody held it); resuming it from '
                'its checkpoint')
  # Another sweep process takes it over, and is stopped by SIGTERM as soon
  # as it starts the trial: it leaves the trial to any other at once. It
  # sees the workdir by another path (a shared filesystem mounted elsewhere).
  elsewhere = tmp_path / 'elsewhere' / workdir.name
  elsewhere.parent.mkdir()
  elsewhere.symlink_to(workdir)
  second = helpers.Watched(_command(sweep_file, elsewhere, storage))
  second.wait_for(r'trial-0000: started')
  second.process.send_signal(signal.SIGTERM)
  assert second.wait() == errors.EXIT_PREEMPTED, second.output[-3000:]
  assert taken_over in second.output
  assert ('trial-0000: stopped with a checkpoint; any sweep process of this '
          'study resumes it') in second.output
  [trial] = _study(workdir, storage).trials
  assert trial.state.name == 'RUNNING'
  assert trial.user_attrs[study_lib.LEASE]['owner'] is None
  # The workdir optuna-dashboard shows: the path of the process that ran it.
  assert trial.user_attrs[study_lib.WORKDIR] == str(elsewhere / 'trial-0000')

  third = helpers.Watched(_command(sweep_file, workdir, storage))
  assert third.wait() == 0, third.output[-3000:]
  assert taken_over in third.output
  log = (trial_dir / 'log.txt').read_text()
  # The checkpoints the restart and the last take-over restored (saved
  # every 22 steps): the evaluations after each that were reported before
  # its kill are not reported again. Which ones they are depends on where
  # SIGKILL landed (a loaded machine lets the trial run on past a save, or
  # cuts one short).
  restored = [int(step) for step in re.findall(r'Restored \S*ckpt-(\d+)', log)]
  for resumed, killed in ((restored[0], trial_kill_step),
                          (restored[-1], sweep_kill_step)):
    for step in range(resumed + 11, killed + 1, 11):
      assert _not_again(step) in log, (step, log[-5000:])
  eval_steps = list(range(11, 133, 11))
  for step in eval_steps:
    # Reported once; a line a killed trial had not yet written out is
    # missing, and the resumed one says it was reported.
    reported = len(re.findall(rf'Reported eval accuracy \S+ at step {step} ',
                              log))
    skipped = _not_again(step) in log
    assert reported == 1 or (reported == 0 and skipped), (step, log[-5000:])
  [trial] = _study(workdir, storage).trials
  assert trial.state.name == 'COMPLETE'
  assert trial.user_attrs[study_lib.WORKDIR] == str(trial_dir)
  assert trial.user_attrs[study_lib.RESTARTS] == 1
  # Trained from the seed the search gave trial 0, kept through restarts.
  assert trial.user_attrs[study_lib.SEED] == study_lib.trial_seed(0, 0)
  assert sorted(trial.intermediate_values) == eval_steps
  results = helpers.read_results(trial_dir)
  assert results['weights_sha256'] == uninterrupted['weights_sha256']
  assert trial.value == results['eval']['accuracy']


@pytest.mark.slow
def test_a_failed_trial_is_failed_with_its_log_and_the_study_goes_on(tmp_path):
  sweep_file = _write_sweep(tmp_path / 'search.py', (
      "hyper.Search(space={'loss': hyper.choice(['user_modules:nan_loss', "
      "'sparse_categorical_crossentropy', 'user_modules:crossentropy'])}, "
      "fixed={'num_epochs': 1, 'export.at_end': False}, num_trials=3, "
      "sampler='grid', pruner=None)"))
  workdir = tmp_path / 'sweep'
  run = helpers.Watched(_command(sweep_file, workdir), env=helpers.env_with())
  assert run.wait() == errors.EXIT_FAILURE, run.output[-3000:]
  study = _study(workdir, '')
  states = {trial.params['loss']: trial.state.name for trial in study.trials}
  assert states == {'user_modules:nan_loss': 'FAIL',
                    'sparse_categorical_crossentropy': 'COMPLETE',
                    'user_modules:crossentropy': 'COMPLETE'}
  # --parallel=1: one warm slot ran the three trials, the failed one too.
  records = [json.loads((workdir / f'trial-{number:04d}' / 'trial.json')
                        .read_text()) for number in range(3)]
  assert [record['warm'] for record in records] == [True] * 3, records
  assert len({record['pid'] for record in records}) == 1, records
  [failed] = [trial for trial in study.trials if trial.state.name == 'FAIL']
  log = workdir / f'trial-{failed.number:04d}' / 'log.txt'
  why = failed.user_attrs[study_lib.FAILURE]
  assert re.fullmatch(rf'exit code 1: The training loss .*diverged.*; '
                      rf'log: {log}', why), why
  assert f'FAILED with {why}' in run.output
  assert 'diverged' in log.read_text()
  assert sorted(row['state'] for row in _read_csv(workdir / 'results.csv')) \
      == ['COMPLETE', 'COMPLETE', 'FAIL']


# One two-worker trial, then one trial of a metric not there, where a test
# ran two searches of two trials and another a two-worker trial.
@pytest.mark.slow
def test_a_search_over_a_task_of_ones_own_with_a_two_worker_trial(tmp_path):
  workdir = tmp_path / 'own'
  run = helpers.Watched(_command(_write_own_task_search(
      tmp_path / 'own.py', 'eval.mae', num_trials=1, num_workers=2), workdir),
                        env=helpers.env_with())
  assert run.wait() == 0, run.output[-3000:]
  [trial] = _study(workdir, '').trials
  assert trial.state.name == 'COMPLETE'
  assert sorted(trial.intermediate_values) == [8, 16]
  results = helpers.read_results(workdir / 'trial-0000')
  assert trial.value == pytest.approx(results['eval']['mae'])
  assert [row['state'] for row in _read_csv(workdir / 'results.csv')] == [
      'COMPLETE']
  log = (workdir / 'trial-0000' / 'log.txt').read_text()
  assert '-m ctl.launch --num_workers=2 --' in log
  assert len(helpers.fingerprint(log)) == 2  # Both workers trained.
  # Only the chief talked to the study: one report an evaluation.
  assert len(re.findall(r'Reported eval mae \S+ at step \d+ ', log)) == 2, \
      log[-3000:]
  assert 'before this run resumed' not in log
  # A metric its eval results never hold: each trial fails at its first
  # evaluation, with one line saying what they hold instead.
  workdir = tmp_path / 'nope'
  run = helpers.Watched(_command(_write_own_task_search(
      tmp_path / 'nope.py', 'eval.nope', num_trials=1), workdir),
                        env=helpers.env_with())
  assert run.wait() == errors.EXIT_FAILURE, run.output[-3000:]
  trials = _study(workdir, '').trials
  assert [trial.state.name for trial in trials] == ['FAIL']
  for trial in trials:
    assert not trial.intermediate_values
    log = workdir / f'trial-{trial.number:04d}' / 'log.txt'
    why = (f"exit code 2: Sweep.metric 'eval.nope' is not in this trial's "
           'eval results (it has: eval.mae, eval.mse); set Sweep.metric in '
           f'the sweep file to one of those; log: {log}')
    assert trial.user_attrs[study_lib.FAILURE] == why
    assert run.output.count(f'trial-{trial.number:04d}: FAILED with {why}\n'
                            ) == 1, run.output[-3000:]
    assert 'Traceback' not in log.read_text()
