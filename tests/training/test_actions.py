"""Actions between loops: a task's own action's requests and state; one-off
steps across a resume; early stopping that decides alike after a SIGTERM
and a restart, its state and the CSV log's rows in the checkpoint; a
chief-only action's stop request agreed by two workers; eval_end sees every
pass's results. Runs whose process is not under test (no signal, no exit
code, no cluster) train in this process: a TensorFlow start saved each."""

import csv
import logging
import math
import re
import shutil
import signal

import pytest

from ctl import errors
from ctl.training import run
import helpers

NOISY = helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py'

# Evaluates every 5 steps; accuracy "improves" only downwards (mode=min), so
# it never improves after the first evaluation: the run stops after the
# 4th, at step 20 of 88, whatever happened in between.
EARLY_STOPPING = (f'--config={helpers.DIGITS}:smoke',
                  '--config.deterministic=True',
                  '--config.intervals.eval_steps=5',
                  '--config.intervals.log_steps=1',
                  '--config.intervals.checkpoint_epochs=0',
                  '--config.early_stopping.metric=accuracy',
                  '--config.early_stopping.mode=min',
                  '--config.early_stopping.patience=3',
                  '--config.log_csv=True')
REASON = ('early stopping: eval accuracy did not improve on 0.75766 (step '
          '5) by more than 0 in 3 evaluation(s)')


def _train_early_stopping(workdir, caplog) -> dict:
  """EARLY_STOPPING's run in this process (the processes under test are
  the first run's and the stopped ones); its results. caplog: its log."""
  caplog.clear()
  # On absl's logger: a run in this process may leave it at WARNING.
  with caplog.at_level(logging.INFO, logger='absl'):
    results = run.train_and_evaluate(
        helpers.config_from_flags(*EARLY_STOPPING), str(workdir))
  return results


def _csv_rows(workdir) -> list[tuple[str, str, str]]:
  """metrics.csv's rows, without the speeds (which differ run to run)."""
  with open(workdir / 'metrics.csv', newline='') as file:
    return [(row['step'], row['name'], row['value'])
            for row in csv.DictReader(file) if 'per_second' not in row['name']]


def _noisy(task, **fields):
  config = helpers.load_config_file(NOISY, task)
  return helpers.override(config, deterministic=True, **fields)


def test_an_actions_requests_are_done_after_its_loop_and_its_state_resumes(
    tmp_path):
  # Evaluation is due at each epoch end (16 steps); step 10 asks for one.
  config = _noisy('MakesRequests', total_steps=20,
                  **{'intervals.keep_checkpoints': 10})
  run.train_and_evaluate(config, str(tmp_path))
  assert (tmp_path / 'evaluated.txt').read_text() == '10 16 20'
  assert (tmp_path / 'checkpoints' / 'ckpt-10.index').exists()
  # Its list of steps comes back from the checkpoint of step 20.
  run.train_and_evaluate(_noisy('MakesRequests'), str(tmp_path))
  assert (tmp_path / 'evaluated.txt').read_text() == '10 16 20 32 48'


def test_one_off_steps_run_once_and_a_resume_runs_only_those_ahead(tmp_path):
  # No interval ends a loop at 7 or 25 (nor at 20 but as the end): the
  # one-off steps do. The resumed run starts after 7 and 20.
  fields = {'intervals.log_steps': 0, 'intervals.checkpoint_steps': 0}
  run.train_and_evaluate(_noisy('RunsAtSteps', total_steps=20, **fields),
                         str(tmp_path))
  assert (tmp_path / 'at_steps.txt').read_text().split() == ['7', '20']
  run.train_and_evaluate(_noisy('RunsAtSteps', **fields), str(tmp_path))
  assert (tmp_path / 'at_steps.txt').read_text().split() == ['7', '20', '25']


def test_eval_end_sees_the_results_of_a_pass_without_outputs(tmp_path):
  results = run.train_and_evaluate(
      _noisy('SeesEvalResults', total_steps=16), str(tmp_path))
  assert results['eval']['mae_seen'] == results['eval']['mae']
  assert results['eval']['outputs_seen'] == 0


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('uninterrupted')
  run = helpers.run_ctl(*EARLY_STOPPING, f'--workdir={workdir}')
  assert run.returncode == 0, run.stderr[-3000:]
  return workdir, helpers.fingerprint(run.stderr)


@pytest.mark.slow
def test_early_stopping_ends_with_exit_0_and_its_reason(uninterrupted,
                                                        caplog):
  workdir, _ = uninterrupted
  results = helpers.read_results(workdir)
  assert results['step'] == 20
  assert results['stopped'] == {'step': 20, 'reason': REASON}
  assert results['eval']['accuracy'] == pytest.approx(0.8384, abs=1e-3)
  rows = _csv_rows(workdir)
  assert len(rows) == len(set((step, name) for step, name, _ in rows))
  assert [int(step) for step, name, _ in rows if name == 'eval/accuracy'] == [
      5, 10, 15, 20]
  assert {int(step) for step, name, _ in rows if name == 'train/loss'} == set(
      range(1, 21))
  _train_early_stopping(workdir, caplog)
  assert f'Training already finished at step 20 of 88 (stopped: {REASON})' in (
      caplog.text)


@pytest.mark.slow
def test_a_stop_killed_before_its_results_finishes_without_training(
    tmp_path, uninterrupted, caplog):
  # A SIGKILL after the checkpoint of the stop, before results.json.
  reference, fingerprint = uninterrupted
  workdir = tmp_path / 'run'
  shutil.copytree(reference, workdir)
  (workdir / 'results.json').unlink()
  again = _train_early_stopping(workdir, caplog)
  assert 'Final weights sha256' in caplog.text  # The log is read.
  assert 'Training from step' not in caplog.text
  assert [again['weights_sha256']] == fingerprint
  assert helpers.read_results(workdir)['stopped'] == helpers.read_results(
      reference)['stopped']


@pytest.mark.slow
@pytest.mark.parametrize('stop_after', [7, 12])
def test_a_sigterm_and_a_restart_stop_at_the_same_step_bit_identical(
    tmp_path, uninterrupted, stop_after, caplog):
  # After step 7 the early stopper has seen 1 evaluation, after 12, 2: its
  # count comes back from the checkpoint, or the resumed run stops later.
  reference, fingerprint = uninterrupted
  for attempt in range(3):
    workdir = tmp_path / str(attempt)
    job = helpers.Watched(helpers.ctl_command(*EARLY_STOPPING,
                                              f'--workdir={workdir}'))
    job.wait_for(rf'step {stop_after}/88 ')
    job.process.send_signal(signal.SIGTERM)
    code = job.wait()
    if code != 0:  # 0: it ran to its stop before the signal landed.
      break
  assert code == errors.EXIT_PREEMPTED, job.output[-3000:]
  stopped = int(re.search(r'Stopped by SIGTERM after step (\d+)',
                          job.output)[1])
  assert stopped < 20
  resumed = _train_early_stopping(workdir, caplog)
  assert f'Training from step {stopped} to 88' in caplog.text
  assert [resumed['weights_sha256']] == fingerprint
  results = helpers.read_results(workdir)
  assert results['stopped'] == helpers.read_results(reference)['stopped']
  # The rows logged after the checkpoint, before the stop, are not twice.
  assert _csv_rows(workdir) == _csv_rows(reference)


@pytest.mark.slow
def test_a_chief_only_stop_request_is_agreed_by_two_workers(tmp_path):
  workdir = tmp_path / 'run'
  codes = helpers.run_workers(
      (f'--config={NOISY}:StoppedByAnAction', f'--workdir={workdir}'),
      helpers.cluster_envs(2), tmp_path)
  logs = [(tmp_path / f'worker{index}.log').read_text() for index in (0, 1)]
  assert codes == [0, 0], logs[1][-3000:]
  for log in logs:
    assert 'Stopped at step 20 of 48' in log, log[-3000:]
  assert len(set(helpers.fingerprint(logs[0] + logs[1]))) == 1
  assert helpers.read_results(workdir)['stopped'] == {
      'step': 20, 'reason': 'asked at step 20'}
  # Only the chief ran it, once at each of its steps.
  assert (workdir / 'stop_request.txt').read_text().split() == [
      '4', '8', '12', '16', '20']


@pytest.mark.slow
def test_a_spiking_loss_is_rolled_back_and_the_run_finishes(tmp_path,
                                                            caplog):
  caplog.set_level('INFO')
  results = run.train_and_evaluate(
      _noisy('SpikesOnce', **{'rollback.max_rollbacks': 2,
                              'rollback.factor': 10.0}),
      str(tmp_path / 'rolled'))
  [line] = [line for line in caplog.messages if 'Rolled back' in line]
  assert re.search(
      r'Rolled back after step 21: the training loss is \S+, over 10 times '
      r'its recent mean \S+ \(rollback 1 of 2\)\. The weights of step 20 '
      r'are back; the data of steps 21\.\.21 is skipped\.', line), line
  assert results['step'] == 48
  assert results['eval']['mae'] < 0.5
  # Without rollback the spike wrecks the model (or its loss turns NaN,
  # which stops the run).
  try:
    plain = run.train_and_evaluate(_noisy('SpikesOnce'),
                                   str(tmp_path / 'plain'))
  except errors.CtlError:
    plain = None
  assert plain is None or plain['eval']['mae'] > 1


def test_each_report_counts_the_train_metrics_of_its_steps_once(tmp_path):
  # Loops of 2 steps, reports every 4: the loop ending at a report reads
  # the metrics itself (steps 4); the stop an action asks after step 6
  # brings a report that reads them in a call of its own.
  config = _noisy('CountsSteps', steps_per_loop=2, log_csv=True,
                  **{'intervals.log_steps': 4})
  run.train_and_evaluate(config, str(tmp_path))
  counted = [(step, value) for step, name, value in _csv_rows(tmp_path)
             if name == 'train/steps_counted']
  assert counted == [('4', '4.0'), ('6', '2.0')]


# Loops of 8 steps, reports at epoch ends (16, 32, 48) and checkpoints
# every 8: the checkpoint of step 40 falls inside the report of steps
# 33..48, and SpikesInItsLog's logged loss spikes at step 41. In loops of
# steps 41..48 the spike stays under 10 times the recent mean; alone in a
# loop it is over.
SPIKE_ARGS = {'steps_per_loop': 8, 'log_csv': True,
              'intervals.log_steps': 16, 'intervals.checkpoint_steps': 8,
              'intervals.async_checkpoint': False,
              'rollback.max_rollbacks': 2, 'rollback.factor': 10.0,
              'rollback.window': 3}


@pytest.mark.slow
def test_a_run_killed_between_reports_decides_and_reports_as_if_not(
    tmp_path, caplog):
  caplog.set_level('INFO')
  reference = run.train_and_evaluate(_noisy('SpikesInItsLog', **SPIKE_ARGS),
                                     str(tmp_path / 'reference'))
  assert 'Rolled back' not in caplog.text
  # The steps each report averaged: (first + last) / 2.
  assert [(step, value) for step, name, value in
          _csv_rows(tmp_path / 'reference') if name == 'train/step'] == [
              ('16', '8.5'), ('32', '24.5'), ('48', '40.5')]

  # SIGKILLed after step 48's log line, before its checkpoint: the run
  # resumes from step 40.
  workdir = tmp_path / 'killed'
  job = helpers.Watched(
      helpers.ctl_command(
          f'--config={NOISY}:SpikesInItsLog', '--config.deterministic=True',
          f'--workdir={workdir}',
          *(f'--config.{name}={value}' for name, value in SPIKE_ARGS.items())),
      env=helpers.env_with(CTL_TEST_HOLD_AFTER_STEP='48'))
  try:
    job.wait_for('Holding after step 48')
  finally:
    job.kill()
  assert helpers.latest_checkpoint_step(workdir) == 40
  caplog.clear()
  resumed = run.train_and_evaluate(_noisy('SpikesInItsLog', **SPIKE_ARGS),
                                   str(workdir))
  assert 'Training from step 40 to 48' in caplog.text
  assert 'Rolled back' not in caplog.text
  # The train metrics' state is not in the checkpoint (README): they count
  # the steps since the resume.
  counted = ('48', 'train/steps_counted', '16.0')
  rows = _csv_rows(tmp_path / 'reference')
  assert counted in rows
  assert _csv_rows(workdir) == [
      row if row != counted else ('48', 'train/steps_counted', '8.0')
      for row in rows]
  assert resumed['weights_sha256'] == reference['weights_sha256']


@pytest.mark.parametrize('log_steps, rolled_back, logged', [
    # Steps 21..22 are rolled back after 22; the report of 24 averages
    # only steps 23..24, and counts 2 of them.
    (4, 22, [('4', '2.5', '4.0'), ('8', '6.5', '4.0'), ('12', '10.5', '4.0'),
             ('16', '14.5', '4.0'), ('20', '18.5', '4.0'),
             ('24', '23.5', '2.0'), ('28', '26.5', '4.0'),
             ('32', '30.5', '4.0')]),
    # A report due at the rollback's step has no step to report.
    (2, 22, [('20', '19.5', '2.0'), ('24', '23.5', '2.0')]),
])
@pytest.mark.slow
def test_a_rollback_starts_the_reports_anew(tmp_path, caplog, log_steps,
                                            rolled_back, logged):
  # Loops of 2 steps; LogsItsSteps' logged loss is NaN at step 21.
  config = _noisy('LogsItsSteps', total_steps=32, steps_per_loop=2,
                  log_csv=True, **{'intervals.log_steps': log_steps,
                                   'rollback.max_rollbacks': 1})
  caplog.set_level('INFO')
  run.train_and_evaluate(config, str(tmp_path))
  assert (f'Rolled back after step {rolled_back}: the training loss is nan'
          in caplog.text)
  rows = _csv_rows(tmp_path)
  steps = {step: value for step, name, value in rows if name == 'train/step'}
  counted = {step: value for step, name, value in rows
             if name == 'train/steps_counted'}
  assert all(math.isfinite(float(value)) for step, name, value in rows
             if name == 'train/loss')
  assert [(step, steps[step], counted[step]) for step, _, _ in logged] == (
      logged)
  if log_steps == 2:
    assert str(rolled_back) not in steps
