"""Sweeps: definitions, trial names, and real runs of `python -m ctl.sweep`."""

import ast
import csv
import json
import pathlib
import re
import signal
import sys
import time

import pytest

from ctl import errors
from ctl import hyper
from ctl.sweep import trials as trials_lib
import helpers

SHORT = {'num_epochs': 1}  # One epoch of digits: a trial takes seconds.


def _write_sweep(directory: pathlib.Path, trials, num_workers=1) -> str:
  path = directory / 'my_sweep.py'
  path.write_text(
      'from ctl import hyper\n\n'
      'def get_sweep():\n'
      f'  return hyper.Sweep(config={helpers.DIGITS!r}, trials={trials!r},\n'
      f'                     metric="eval.accuracy", num_workers={num_workers})\n')
  return str(path)


def _sweep_command(sweep_file, workdir, parallel=1) -> list[str]:
  return [sys.executable, '-m', 'ctl.sweep', f'--sweep={sweep_file}',
          f'--workdir={workdir}', f'--parallel={parallel}']


def _read_csv(path: pathlib.Path) -> list[dict]:
  with open(path, newline='') as file:
    return list(csv.DictReader(file))


# Definitions.


def test_product_crosses_and_zip_pairs_factors():
  grid = hyper.product(hyper.sweep('a', [1, 2]), hyper.sweep('b.c', ['x', 'y']),
                       hyper.fixed({'d': True}))
  assert grid == [{'a': 1, 'b.c': 'x', 'd': True}, {'a': 1, 'b.c': 'y', 'd': True},
                  {'a': 2, 'b.c': 'x', 'd': True}, {'a': 2, 'b.c': 'y', 'd': True}]
  assert hyper.zip(hyper.sweep('a', [1, 2]), hyper.sweep('b', [3, 4])) == [
      {'a': 1, 'b': 3}, {'a': 2, 'b': 4}]
  with pytest.raises(ValueError, match='one length'):
    hyper.zip(hyper.sweep('a', [1, 2]), hyper.sweep('b', [3]))
  with pytest.raises(ValueError, match=r"\['a'\] set by two factors"):
    hyper.product(hyper.sweep('a', [1]), hyper.sweep('a', [2]))


def test_random_search_is_seeded_and_in_range():
  space = {'lr': hyper.log_uniform(1e-4, 1e-1), 'dropout': hyper.uniform(0, 0.5),
           'width': hyper.choice([32, 64])}
  trials = hyper.random(50, seed=3, distributions=space)
  assert trials == hyper.random(50, seed=3, distributions=space)
  assert trials != hyper.random(50, seed=4, distributions=space)
  assert all(1e-4 <= t['lr'] < 1e-1 and 0 <= t['dropout'] < 0.5 and
             t['width'] in (32, 64) for t in trials)
  # Log-uniform: about as many draws below 1e-2.5 as above.
  below = sum(t['lr'] < 10**-2.5 for t in trials)
  assert 15 < below < 35


def test_trial_names_are_short_safe_and_unique():
  names = trials_lib.trial_names([
      {'optimizer.learning_rate': 0.001, 'batch_size': 32},
      {'optimizer.learning_rate': 0.0123456, 'batch_size': 64},
      {'metrics': ('accuracy', 'top5_accuracy'), 'data.path': '/a/b c'},
  ])
  assert names == ['learning_rate=0.001-batch_size=32',
                   'learning_rate=0.01235-batch_size=64',
                   'metrics=accuracy+top5_accuracy-path=_a_b_c']
  # Keys whose last parts clash keep their full names.
  assert trials_lib.trial_names([{'model.width': 1, 'data.width': 2}]) == [
      'model.width=1-data.width=2']
  # Values equal to 4 digits get a hash of the exact overrides.
  close = trials_lib.trial_names([{'lr': 0.10001}, {'lr': 0.10002}])
  assert close[0] != close[1] and all(n.startswith('lr=0.1-') for n in close)
  long = trials_lib.trial_names([{f'key{i}': i for i in range(30)}])[0]
  assert len(long) <= 80
  with pytest.raises(errors.ConfigError, match='same overrides'):
    trials_lib.trial_names([{'lr': 1.0}, {'lr': 1.0}])


def test_trial_names_name_only_what_varies():
  trials = hyper.product(
      hyper.fixed({'mlflow.tracking_uri': 'http://127.0.0.1:5000',
                   'num_epochs': 3, 'model.width': 64}),
      hyper.sweep('optimizer.learning_rate', [0.001, 0.01]),
      hyper.sweep('data.width', [1, 2]))
  # data.width is short for what varies: model.width is fixed.
  assert trials_lib.trial_names(trials) == [
      'learning_rate=0.001-width=1', 'learning_rate=0.001-width=2',
      'learning_rate=0.01-width=1', 'learning_rate=0.01-width=2']
  # A key some trials leave out varies; one trial names all it sets.
  assert trials_lib.trial_names([{'lr': 0.1, 'seed': 1}, {'lr': 0.1}]) == [
      'seed=1', 'base']
  assert trials_lib.trial_names(hyper.fixed({'num_epochs': 3})) == [
      'num_epochs=3']


def test_a_rerun_keeps_the_names_an_earlier_ctl_gave_its_trials(tmp_path):
  # ctl 0.1.0 named trials after every override: a rerun of its sweep
  # workdir resumes them under those names instead of training anew.
  trials = hyper.product(hyper.fixed({'num_epochs': 1}),
                         hyper.sweep('optimizer.learning_rate', [0.01, 0.1]))
  (tmp_path / 'sweep.json').write_text(json.dumps({'trials': [
      {'name': 'num_epochs=1-learning_rate=0.01', 'overrides': trials[0]},
      {'name': 'num_epochs=1-learning_rate=0.1', 'overrides': trials[1]}]}))
  sweep = hyper.Sweep(config=helpers.DIGITS, trials=trials)
  planned = trials_lib.plan(sweep, helpers.DIGITS, str(tmp_path))
  assert [trial.name for trial in planned] == [
      'num_epochs=1-learning_rate=0.01', 'num_epochs=1-learning_rate=0.1']
  assert [trial.name for trial in trials_lib.plan(
      sweep, helpers.DIGITS, str(tmp_path / 'new'))] == [
          'learning_rate=0.01', 'learning_rate=0.1']


def test_a_typo_in_one_trial_fails_the_sweep_before_anything_runs(tmp_path):
  sweep_file = _write_sweep(tmp_path, [
      {'optimizer.learning_rate': 0.01}, {'optimizer.learning_rat': 0.1},
      {'optimizer.learning_rate': 'fast'}])
  run = helpers.Watched(_sweep_command(sweep_file, tmp_path / 'sweep'))
  assert run.wait() == errors.EXIT_USAGE
  assert '2 of 3 trials cannot run; nothing was started' in run.output
  assert ("trial 1 (learning_rat=0.1): Unknown config key in "
          "--config.optimizer.learning_rat=0.1") in run.output
  assert 'trial 2 (learning_rate=fast): flag --config.optimizer.learning_rate'\
      in run.output
  assert not (tmp_path / 'sweep').exists()


def test_an_unknown_metric_fails_the_sweep_before_anything_runs(tmp_path):
  sweep_file = tmp_path / 'bad_metric.py'
  sweep_file.write_text(
      'from ctl import hyper\n'
      f'def get_sweep():\n  return hyper.Sweep(config={helpers.DIGITS!r}, '
      "trials=[{'num_epochs': 1}], metric='eval.acc')\n")
  run = helpers.Watched(_sweep_command(sweep_file, tmp_path / 'sweep'))
  assert run.wait() == errors.EXIT_USAGE
  assert "Sweep.metric 'eval.acc' is not in its results" in run.output
  assert not (tmp_path / 'sweep').exists()
  # The best checkpoint's record, where the config keeps none.
  sweep_file.write_text(
      'from ctl import hyper\n'
      f'def get_sweep():\n  return hyper.Sweep(config={helpers.DIGITS!r}, '
      "trials=[{'num_epochs': 1, 'evaluation.best_metric': ''}], "
      "metric='best.eval.accuracy')\n")
  run = helpers.Watched(_sweep_command(sweep_file, tmp_path / 'sweep'))
  assert run.wait() == errors.EXIT_USAGE
  assert ("Sweep.metric 'best.eval.accuracy' reads the best checkpoint, "
          "which config.evaluation.best_metric='' keeps none of") in run.output
  assert not (tmp_path / 'sweep').exists()


def _write_own_task_sweep(directory, metric) -> str:
  path = directory / f'own_{metric.replace(".", "_")}.py'
  config = helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py'
  path.write_text(
      'from ctl import hyper\n\n'
      'def get_sweep():\n'
      f'  return hyper.Sweep(config={str(config)!r},\n'
      "                     trials=hyper.sweep('seed', [0]),\n"
      f'                     metric={metric!r}, mode="min", num_workers=2)\n')
  return str(path)


# One two-worker trial, where a test ran two trials of one worker and
# another a two-worker trial of digits.
@pytest.mark.slow
def test_a_sweep_of_a_task_of_ones_own_with_two_worker_trials(tmp_path):
  # A config from ctl.base_config() names no metrics: the sweep's metric
  # is looked up in each trial's results (it died of KeyError: 'metrics').
  workdir = tmp_path / 'sweep'
  run = helpers.Watched(
      _sweep_command(_write_own_task_sweep(tmp_path, 'eval.mae'), workdir))
  assert run.wait() == 0, run.output
  rows = _read_csv(workdir / 'results.csv')
  assert [row['status'] for row in rows] == ['finished']
  assert all(float(row['eval.mae']) >= 0 for row in rows)
  assert 'best: seed=' in run.output
  # A trial can be a multi-worker job.
  log = (workdir / rows[0]['trial'] / 'log.txt').read_text()
  assert '-m ctl.launch --num_workers=2 --' in log
  assert len(helpers.fingerprint(log)) == 2
  # A metric its results never hold fails each trial with one line naming
  # what they hold (the trials are not run again).
  run = helpers.Watched(
      _sweep_command(_write_own_task_sweep(tmp_path, 'eval.nope'), workdir))
  assert run.wait() == errors.EXIT_FAILURE
  assert run.output.count('finished without eval.nope in its results (it '
                          'has: step, epoch, eval.mae, eval.mse)') == 1, \
      run.output


# experiments/ also holds example tasks; a sweep file defines get_sweep.
def test_hyper_refuses_what_it_cannot_sample_or_run():
  refused = {
      r'hyper.choice\(\[\]\): give a list of one or more values':
          lambda: hyper.choice([]),
      r"hyper.choice\('adam'\): give a list": lambda: hyper.choice('adam'),
      r'low is above high; write hyper.log_uniform\(0.0001, 0.01\)':
          lambda: hyper.log_uniform(1e-2, 1e-4),
      r'hyper.log_uniform\(low=0, high=1\): a log scale needs low > 0':
          lambda: hyper.log_uniform(0, 1),
      r'write hyper.uniform\(0.1, 0.5\)': lambda: hyper.uniform(0.5, 0.1),
      r"hyper.uniform\(low='0', high=1\): its bounds must be finite numbers":
          lambda: hyper.uniform('0', 1),
      r'high=inf\): its bounds must be finite numbers':
          lambda: hyper.uniform(0, float('inf')),
      r'hyper.integer\(low=0.5, high=4\): its bounds must be ints':
          lambda: hyper.integer(0.5, 4),
      r'write hyper.integer\(1, 3\)': lambda: hyper.integer(3, 1),
      r"Sweep.num_workers='2': use an int, 1 or more":
          lambda: hyper.Sweep(config='c.py', trials=[{}], num_workers='2'),
      r'Sweep.num_workers=0: use an int, 1 or more':
          lambda: hyper.Sweep(config='c.py', trials=[{}], num_workers=0),
      r'Sweep.num_workers=True':
          lambda: hyper.Sweep(config='c.py', trials=[{}], num_workers=True),
      r'Sweep.trials is dict: use a list of override dicts':
          lambda: hyper.Sweep(config='c.py', trials={'seed': 1}),
      r'Sweep.trials\[1\] is int: use a dict':
          lambda: hyper.Sweep(config='c.py', trials=[{'seed': 1}, 2]),
      r'Sweep.config=None': lambda: hyper.Sweep(config=None, trials=[{}]),
      r'Sweep.metric=3': lambda: hyper.Sweep(config='c.py', trials=[{}],
                                            metric=3),
  }
  for message, make in refused.items():
    with pytest.raises(ValueError, match=message):
      make()
  # Equal bounds are a range of one value, as Optuna takes them.
  assert hyper.uniform(0.1, 0.1).low == 0.1


HOSTILE_SWEEPS = {
    'num_workers_str': (
        f"return hyper.Sweep(config={helpers.DIGITS!r}, trials=[{{}}], "
        "num_workers='2')",
        "ValueError: Sweep.num_workers='2': use an int, 1 or more"),
    'exits': ('sys.exit(0)', 'it called sys.exit(0); get_sweep() must return '
              'a ctl.hyper.Sweep'),
}


@pytest.mark.parametrize('case', HOSTILE_SWEEPS)
def test_a_hostile_sweep_file_is_one_line_before_anything_is_written(
    tmp_path, case):
  body, message = HOSTILE_SWEEPS[case]
  sweep_file = tmp_path / f'{case}.py'
  sweep_file.write_text('import sys\nfrom ctl import hyper\n\n'
                        f'def get_sweep():\n  {body}\n')
  run = helpers.Watched(_sweep_command(sweep_file, tmp_path / 'sweep'),
                        env=helpers.env_with(TF_CPP_MIN_LOG_LEVEL='3'))
  helpers.assert_sweep_refused(run, message, tmp_path / 'sweep')


def test_a_workdir_that_is_not_utf8_is_refused_before_anything_is_written(
    tmp_path):
  sweep_file = _write_sweep(tmp_path, [{'num_epochs': 1}])
  # As a shell passes $'sweep\xff': the byte that is not UTF-8 comes to
  # Python as a surrogate.
  workdir = tmp_path / 'sweep\udcff'
  run = helpers.Watched(_sweep_command(sweep_file, workdir),
                        env=helpers.env_with(TF_CPP_MIN_LOG_LEVEL='3'))
  helpers.assert_sweep_refused(run, f'--workdir={tmp_path}/sweep\\xff is not UTF-8 text',
                  workdir)


SWEEP_FILES = sorted(path for path in (helpers.REPO / 'experiments').glob('*.py')
                     if 'def get_sweep(' in path.read_text())


def test_there_are_shipped_sweeps():
  assert {path.stem for path in SWEEP_FILES} >= {'digits_lr', 'digits_random',
                                                 'digits_search'}


@pytest.mark.parametrize('sweep_file', SWEEP_FILES, ids=lambda path: path.stem)
def test_every_shipped_sweep_loads_and_its_trials_check_out(sweep_file,
                                                            tmp_path):
  sweep, config_file = trials_lib.load_sweep(str(sweep_file))
  assert pathlib.Path(config_file).is_file()
  if sweep.search is not None:
    from ctl.sweep import search  # pylint: disable=g-import-not-at-top
    search.check(sweep, config_file)
    assert sweep.search.num_trials >= 4
  else:
    planned = trials_lib.plan(sweep, config_file, str(tmp_path))
    assert len(planned) == len(sweep.trials) >= 4
  docstring = ast.get_docstring(ast.parse(sweep_file.read_text()))
  assert f'python -m ctl.sweep --sweep=experiments/{sweep_file.name}' in (
      docstring)


# Real sweeps.


# Two trials and a failing one, where one test ran four trials and
# another a failing one beside a fifth.
@pytest.mark.slow
def test_a_sweep_end_to_end_reports_a_failed_trial_and_the_others_go_on(
    tmp_path):
  trials = [*hyper.product(hyper.fixed(SHORT), hyper.zip(
      hyper.sweep('optimizer.learning_rate', [0.003, 0.01]),
      hyper.sweep('batch_size', [32, 64]))),
            dict(SHORT, loss='user_modules:segfault_loss'),
            dict(SHORT, loss='user_modules:nan_loss')]
  workdir = tmp_path / 'sweep'
  # TF_CPP_MIN_LOG_LEVEL=3 does not hide TensorFlow's start-up lines: ctl
  # does, here in the sweep process, which imports TensorFlow after its checks.
  run = helpers.Watched(_sweep_command(_write_sweep(tmp_path, trials), workdir,
                                       parallel=2),
                        env=helpers.env_with(TF_CPP_MIN_LOG_LEVEL='3'))
  run.wait_for(r': started \(pid', timeout=300)
  # Its trials do not wait for the sweep process's own TensorFlow import
  # (about 24 s): it imports TensorFlow for the report, after them.
  maps = pathlib.Path(f'/proc/{run.process.pid}/maps').read_text()
  assert 'libtensorflow_framework' not in maps
  assert run.wait() == errors.EXIT_FAILURE, run.output[-3000:]
  for noise in ('oneDNN', 'cuInit', 'cpu_feature_guard', 'cudart_stub',
                'InitializeLog'):
    assert noise not in run.output, run.output[-3000:]

  rows = _read_csv(workdir / 'results.csv')
  assert [row['status'] for row in rows] == [
      'finished', 'finished', 'exit code -11', 'exit code 1']
  *rows, segfault_row, failed_row = rows
  assert [(float(row['optimizer.learning_rate']), int(row['batch_size']))
          for row in rows] == [(0.003, 32), (0.01, 64)]
  for row in rows:
    assert int(row['step']) == 1438 // int(row['batch_size'])
    assert 0.5 < float(row['eval.accuracy']) <= 1
    assert float(row['wall_seconds']) > 0
    assert (pathlib.Path(row['workdir']) / 'results.json').exists()
  assert len([path for path in workdir.iterdir() if path.is_dir()]) == 4
  best = max(rows, key=lambda row: float(row['eval.accuracy']))
  assert f'best: {best["trial"]}' in run.output
  assert (workdir / 'eval.accuracy.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'

  # The failed trial's line says why: the trial's own `ctl: error:` line.
  segfault, failed = trials_lib.trial_names(trials)[2:]
  assert re.search(rf'{segfault}: FAILED with exit code -11; log: ',
                   run.output), run.output[-3000:]
  # Two warm slots ran the four trials; the one the segfault killed was
  # replaced by a fresh slot.
  records = [json.loads((workdir / name / 'trial.json').read_text())
             for name in trials_lib.trial_names(trials)]
  assert all(record['warm'] for record in records), records
  assert len({record['pid'] for record in records}) <= 3, records
  assert failed_row['trial'] == failed
  log = workdir / failed / 'log.txt'
  assert re.search(rf'{failed}: FAILED with exit code 1: The training loss .*'
                   rf'diverged.*; log: {log}$',
                   run.output, re.MULTILINE), run.output[-3000:]
  assert 'diverged' in log.read_text()

  experiment, sessions = _read_hparams(workdir, [row['workdir'] for row in rows])
  assert [info.name for info in experiment.hparam_infos] == [
      'num_epochs', 'optimizer.learning_rate', 'batch_size', 'loss']
  assert {(info.name.group, info.name.tag) for info in experiment.metric_infos} \
      >= {('eval', 'accuracy'), ('eval', 'loss')}
  for row, session in zip(rows, sessions):
    assert session.group_name == row['trial']
    assert session.hparams['batch_size'].number_value == int(row['batch_size'])
    assert session.hparams['optimizer.learning_rate'].number_value == float(
        row['optimizer.learning_rate'])


def _read_hparams(sweep_dir, trial_dirs):
  """The experiment and each trial's session, read by TensorBoard's reader."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  from tensorboard.plugins.hparams import metadata  # pylint: disable=g-import-not-at-top

  def content(directory):
    accumulator = event_accumulator.EventAccumulator(str(directory))
    accumulator.Reload()
    [(_, data)] = accumulator.PluginTagToContent('hparams').items()
    return data

  experiment = metadata.parse_experiment_plugin_data(content(sweep_dir))
  sessions = [metadata.parse_session_start_info_plugin_data(content(directory))
              for directory in trial_dirs]
  return experiment, sessions


# One sweep killed, its rerun stopped by SIGTERM, and the same command
# again, where two tests each ran a sweep and its rerun.
@pytest.mark.slow
def test_a_killed_or_sigtermed_sweep_is_resumed_by_the_same_command(tmp_path):
  # 20 epochs: killed at its first checkpoint (step 44), the second trial
  # has 836 steps to go (about a second); with 2 epochs it once finished
  # within the 50 ms the test takes to see that checkpoint. The first and
  # third are only finished and skipped, or not started: one epoch each.
  trials = hyper.product(
      hyper.fixed({'export.at_end': False}),
      hyper.zip(hyper.sweep('num_epochs', [1, 20, 1]),
                hyper.sweep('optimizer.learning_rate', [0.001, 0.002, 0.003])))
  sweep_file, workdir = _write_sweep(tmp_path, trials), tmp_path / 'sweep'
  first, second, third = (workdir / name
                          for name in trials_lib.trial_names(trials))
  runner = helpers.Watched(_sweep_command(sweep_file, workdir))
  runner.wait_for(f'{first.name}: finished', timeout=300)
  helpers.wait_for_checkpoint(second, runner.process)
  runner.process.send_signal(signal.SIGKILL)
  runner.wait()
  # The running trial (its warm slot) died with its runner: nothing trains
  # unwatched.
  helpers.wait_until_gone(_trial_pid(runner.output, second.name))
  assert not helpers.processes_mentioning(str(second))
  finished_files = _trained_files(first)
  killed_at = helpers.latest_checkpoint_step(second)

  # The rerun skips the finished trial and resumes the killed one; SIGTERM
  # once it saved again stops it, and starts no other trial.
  runner = helpers.Watched(_sweep_command(sweep_file, workdir))
  _wait_for_checkpoint_after(second, killed_at, runner.process)
  runner.process.send_signal(signal.SIGTERM)
  assert runner.wait() == errors.EXIT_PREEMPTED, runner.output[-3000:]
  assert f'{first.name}: finished before, skipped' in runner.output
  assert (f'{second.name}: stopped (exit code {errors.EXIT_PREEMPTED}); the '
          'same command resumes it') in runner.output, runner.output[-3000:]
  assert 'FAILED' not in runner.output
  assert not third.exists()  # Not started after the signal.
  assert not helpers.processes_mentioning(str(second))
  helpers.wait_until_gone(_trial_pid(runner.output, second.name))
  assert json.loads((second / 'trial.json').read_text())['warm']

  rerun = helpers.Watched(_sweep_command(sweep_file, workdir))
  assert rerun.wait() == 0, rerun.output[-3000:]
  assert _trained_files(first) == finished_files
  assert (second / 'log.txt').read_text().count('Restored') == 2
  rows = _read_csv(workdir / 'results.csv')
  assert [row['status'] for row in rows] == ['finished'] * 3


def _trial_pid(output: str, name: str) -> int:
  """The pid of the process that ran trial `name` last, as its runner said."""
  return int(re.findall(rf'{name}: started \(pid (\d+)\)', output)[-1])


def _wait_for_checkpoint_after(workdir: pathlib.Path, step: int, process,
                               timeout: float = 300) -> None:
  """Waits until workdir has a checkpoint after step, while process runs."""
  deadline = time.monotonic() + timeout
  while helpers.latest_checkpoint_step(workdir) <= step:
    assert process.poll() is None, f'exited before a checkpoint after {step}'
    assert time.monotonic() < deadline, f'no checkpoint within {timeout} s'
    time.sleep(0.05)


def _trained_files(trial_dir):
  """What training wrote: all but the HParams session a report may add."""
  return {name: stamp for name, stamp in helpers.file_stamps(trial_dir).items()
          if not name.endswith('.hparams')}
