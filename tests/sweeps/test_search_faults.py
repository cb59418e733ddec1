"""A search against faults of its trials and of its study's storage: a
trial killed by a signal while its sweep process lives, a PostgreSQL server
restarted (or gone for good) mid-sweep, a journal whose last record was
cut. Real processes, a real PostgreSQL server, a real journal file."""

import json
import os
import pathlib
import re
import signal
import sys
import time
import uuid

import pytest

from ctl import errors
from ctl.runtime import studies
from ctl.sweep import study as study_lib
from ctl.sweep import trials as trials_lib
import helpers
import postgres

# One epoch of 16 steps of a tiny task, evaluated every 8.
_OWN_TASK = helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py'
# 45 epochs of 22 steps, a checkpoint each epoch, an evaluation every 11:
# long enough to run on through a storage's outage of a few seconds. No
# export: none is looked at.
_LONG = {'num_epochs': 45, 'batch_size': 64, 'intervals.eval_steps': 11,
         'export.at_end': False}


def _own_task_search(path: pathlib.Path, num_trials: int) -> str:
  """A sweep file: a search of tiny trials over a task of one's own."""
  path.write_text(
      'from ctl import hyper\n\n'
      'def get_sweep():\n'
      f'  return hyper.Sweep(config={str(_OWN_TASK)!r}, search=hyper.Search(\n'
      "      space={'seed': hyper.choice(list(range(8)))}, "
      f"num_trials={num_trials}, sampler='grid', pruner=None,\n"
      "      fixed={'num_epochs': 1, 'intervals.eval_steps': 8,\n"
      "             'export.at_end': False}),\n"
      '      metric="eval.mae", mode="min")\n')
  return str(path)


def _digits_search(path: pathlib.Path) -> str:
  """A sweep file: two digits trials of 990 steps, reported every 11."""
  path.write_text(
      'from ctl import hyper\n\n'
      'def get_sweep():\n'
      f'  return hyper.Sweep(config={helpers.DIGITS!r}, search=hyper.Search(\n'
      "      space={'optimizer.learning_rate': hyper.choice([0.003, 0.01])},\n"
      f"      fixed={_LONG!r}, num_trials=2, sampler='grid', pruner=None),\n"
      '      metric="eval.accuracy", mode="max")\n')
  return str(path)


def _command(sweep_file: str, workdir: pathlib.Path, *flags: str) -> list[str]:
  return [sys.executable, '-m', 'ctl.sweep', f'--sweep={sweep_file}',
          f'--workdir={workdir}', *flags]


def _trials(workdir: pathlib.Path, storage: str = ''):
  """The study's trials, as the sweep processes left them."""
  optuna = studies.import_optuna()
  url = study_lib.storage_url(storage, str(workdir))
  return optuna.load_study(study_name=workdir.name,
                           storage=studies.open_storage(url)).trials


@pytest.fixture
def own_server():
  """A PostgreSQL server of this test's own, which it may stop and start."""
  server = postgres.PostgresServer()
  server.start()
  yield server
  if server.halted:
    server.start_again()  # A test that failed while it was halted.
  server.stop()


# One search, then its journal cut and the same command again, where two
# tests each ran a search of their own and the second its rerun.
@pytest.mark.slow
def test_a_trial_killed_again_and_again_fails_then_a_cut_journal_is_mended(
    tmp_path):
  # As the OOM killer would, every time: restarted MAX_RESTARTS times, then
  # FAIL, saying so; the sweep goes on to its next trial.
  workdir = tmp_path / 'sweep'
  command = _command(_own_task_search(tmp_path / 's.py', 2), workdir)
  run = helpers.Watched(command)
  for start in range(study_lib.MAX_RESTARTS + 1):
    os.kill(_trial_pid(run, start), signal.SIGKILL)
  assert run.wait() == errors.EXIT_FAILURE, run.output[-3000:]
  for restart in range(1, study_lib.MAX_RESTARTS + 1):
    assert (f'trial-0000: killed by SIGKILL, not by an error of its own; '
            f'restarting it from its checkpoint (restart {restart} of '
            f'{study_lib.MAX_RESTARTS})') in run.output
  why = (f'exit code -9: killed by SIGKILL after {study_lib.MAX_RESTARTS} '
         'restarts from its checkpoint')
  assert f'trial-0000: FAILED with {why}' in run.output, run.output[-3000:]
  trials = _trials(workdir)
  assert [trial.state.name for trial in trials] == ['FAIL', 'COMPLETE']
  assert trials[0].user_attrs[study_lib.FAILURE].startswith(why)

  # The journal's last record cut, as if its writer was killed as it wrote:
  # the same command moves the cut record aside and goes on from the rest
  # (exit 1 again: its report still has trial-0000's FAIL).
  journal = workdir / 'study.journal'
  whole = journal.read_bytes()
  os.truncate(journal, len(whole) - 40)
  kept = whole[:whole.rindex(b'\n', 0, len(whole) - 40) + 1]
  again = helpers.Watched(command)  # Repaired.
  assert again.wait() == errors.EXIT_FAILURE, again.output[-3000:]
  assert 'Traceback' not in again.output
  assert 'ctl.sweep: error:' not in again.output, again.output[-3000:]
  assert 'best: trial-0001' in again.output, again.output[-3000:]  # Reported.
  [backup] = [path for path in workdir.iterdir()
              if path.name.startswith('study.journal.cut-')]
  assert backup.read_bytes() == whole[len(kept):-40]
  assert (f'The study journal {journal} ended in a cut record '
          f'({len(whole) - 40 - len(kept)} bytes, no line end') in again.output
  assert f'moved it to {backup}.' in again.output
  assert journal.read_bytes().startswith(kept)
  # Every later opening as well, as the sweep processes' (studies.
  # open_storage): nothing more to move aside, nothing cut off.
  repaired = journal.read_bytes()
  assert [trial.state.name for trial in _trials(workdir)] == [
      'FAIL', 'COMPLETE']
  assert journal.read_bytes() == repaired
  assert [path.name for path in workdir.iterdir()
          if path.name.startswith('study.journal.cut-')] == [backup.name]


def _trial_pid(run: helpers.Watched, start: int, timeout: float = 300,
               name: str = 'trial-0000') -> int:
  """The pid of trial `name`'s process of start number `start` (0: first)."""
  deadline = time.monotonic() + timeout
  while True:
    pids = re.findall(name + r': started \(pid (\d+)\)', run.output)
    if len(pids) > start:
      return int(pids[start])
    assert run.process.poll() is None, run.output[-3000:]
    assert time.monotonic() < deadline, run.output[-3000:]
    time.sleep(0.05)


def _wait_for_count(run: helpers.Watched, pattern: str, count: int,
                    timeout: float = 120) -> None:
  """Waits until `count` lines of run's output match pattern, while it runs."""
  deadline = time.monotonic() + timeout
  while len(re.findall(pattern, run.output)) < count:
    assert run.process.poll() is None, run.output[-3000:]
    assert time.monotonic() < deadline, run.output[-3000:]
    time.sleep(0.05)


# One server, one study, three sweep processes in turn, where three tests
# each started a server and a study of their own: a restart that is waited
# out, a SIGTERM while the storage is down, and an outage longer than
# --storage_wait_seconds, each resumed by the next sweep process.
@pytest.mark.slow
def test_a_postgresql_outage_is_waited_out_or_stops_the_sweep_resumable(
    own_server, tmp_path):
  storage = own_server.create_database(f'study_{uuid.uuid4().hex[:8]}')
  workdir = tmp_path / 'sweep'
  sweep_file = _digits_search(tmp_path / 's.py')
  logs = [workdir / f'trial-{number:04d}' / 'log.txt' for number in (0, 1)]
  # A restart mid-sweep is waited out (600 s by default).
  run = helpers.Watched(_command(sweep_file, workdir, f'--storage={storage}'))
  helpers.wait_for_line(logs[0], r'Reported eval accuracy \S+ at step 11 ',
                        run)
  own_server.halt()
  run.wait_for(r'\[sweep\] the study storage .* does not answer')
  # The trial trains on, its reports not taken.
  helpers.wait_for_line(logs[0], r"The study did not take step \d+'s eval",
                        run)
  assert run.process.poll() is None, run.output[-3000:]
  own_server.start_again()
  run.wait_for(r'the study storage answers again after \d+ s; going on')
  run.wait_for(r'trial-0000: COMPLETE', timeout=300)
  # What the study holds of trial-0000 is checked at the end: loading the
  # study here took long enough, under CI's load, for trial-0001 to train
  # all its steps before the SIGSTOP below.

  # SIGTERM stops a sweep process waiting for its storage.
  trial_pid = _trial_pid(run, 0, name='trial-0001')
  helpers.wait_for_line(logs[1], r'Reported eval accuracy \S+ at step 11 ',
                        run)
  # Held at once (its pid known before), so that most of its steps are left
  # for the next part: it may train all of them in a few seconds.
  os.kill(trial_pid, signal.SIGSTOP)
  try:
    own_server.halt()
    _wait_for_count(run, r'\[sweep\] the study storage .* does not answer', 2)
    run.process.send_signal(signal.SIGTERM)
  finally:
    os.kill(trial_pid, signal.SIGCONT)
  assert run.wait(timeout=300) == errors.EXIT_PREEMPTED, run.output[-3000:]
  assert 'Traceback' not in run.output
  assert [line for line in run.output.splitlines()
          if line.startswith('ctl.sweep: ')] == [
              f'ctl.sweep: The study storage postgresql+psycopg://ctl@'
              f'127.0.0.1:{own_server.port}/{storage.rsplit("/", 1)[1]} '
              'does not answer: ' + run.output.split(' does not answer: ')[-1]
              .splitlines()[0]]
  record = json.loads((workdir / 'trial-0001' / 'trial.json').read_text())
  assert record['exit_code'] == errors.EXIT_PREEMPTED  # With a checkpoint.

  # Gone longer than --storage_wait_seconds: the sweep process stops its
  # trials with a checkpoint and exits 1.
  own_server.start_again()
  command = _command(sweep_file, workdir, f'--storage={storage}',
                     '--storage_wait_seconds=3')
  run = helpers.Watched(command)
  trial_pid = _trial_pid(run, 0, name='trial-0001')
  helpers.wait_for_line(logs[1], r'Restored \S*ckpt-\d+[\s\S]*Reported eval '
                        r'accuracy \S+ at step \d+ ', run)
  # The trial is held until the sweep process gives up: what is left of its
  # steps after the outage above may train in less than the 3 s waited.
  os.kill(trial_pid, signal.SIGSTOP)
  try:
    own_server.halt()
    run.wait_for(r'\[sweep\] the study storage did not answer in time')
  finally:
    os.kill(trial_pid, signal.SIGCONT)
  assert run.wait() == errors.EXIT_FAILURE, run.output[-3000:]
  assert ('trial-0001: taken over (nobody held it); resuming it from its '
          'checkpoint') in run.output
  assert 'Traceback' not in run.output
  error_lines = [line for line in run.output.splitlines()
                 if re.match(r'ctl\S*: error:', line)]
  assert len(error_lines) == 1, run.output[-3000:]
  assert error_lines[0].startswith(
      'ctl.sweep: error: The study storage postgresql+psycopg://ctl@'
      f'127.0.0.1:{own_server.port}/')
  assert 'did not answer for 3 s (--storage_wait_seconds; ' in error_lines[0]
  assert 'StorageInternalError' not in run.output  # The database's error.
  assert ('[sweep] the study storage did not answer in time: stopping the '
          'running trials with a checkpoint.') in run.output
  record = json.loads((workdir / 'trial-0001' / 'trial.json').read_text())
  assert record['exit_code'] == errors.EXIT_PREEMPTED  # With a checkpoint.

  own_server.start_again()
  trials = _trials(workdir, storage)
  assert [trial.state.name for trial in trials] == ['COMPLETE', 'RUNNING']
  assert trials[0].value == helpers.read_results(
      workdir / 'trial-0000')['eval']['accuracy']
  again = helpers.Watched(command)
  assert again.wait() == 0, again.output[-3000:]
  assert ('trial-0001: taken over (nobody held it); resuming it from its '
          'checkpoint') in again.output
  assert len(re.findall(r'Restored \S*ckpt-\d+', logs[1].read_text())) == 2
  assert [trial.state.name for trial in _trials(workdir, storage)] == [
      'COMPLETE', 'COMPLETE']


@pytest.mark.slow
def test_a_trial_whose_asker_died_before_drawing_it_is_drawn_by_its_taker(
    tmp_path):
  # The sweep process that asked the study for trial 0 died before it drew
  # the trial's seed and values (so before the trial started): the next
  # sweep process takes the trial over and draws them as for a new trial,
  # rather than training it at the config's (batch_size 32, its seed).
  sweep_file = tmp_path / 'search.py'
  sweep_file.write_text(
      'from ctl import hyper\n\n'
      'def get_sweep():\n'
      f'  return hyper.Sweep(config={str(_OWN_TASK)!r}, search=hyper.Search(\n'
      "      space={'batch_size': hyper.integer(40, 64)},\n"
      "      num_trials=1, pruner=None, seed=5,\n"
      "      fixed={'num_epochs': 1, 'intervals.eval_steps': 8,\n"
      "             'export.at_end': False}),\n"
      '      metric="eval.mae", mode="min")\n')
  workdir = tmp_path / 'sweep'
  sweep, _ = trials_lib.load_sweep(str(sweep_file))
  study_lib.open_study(sweep, study_lib.storage_url('', str(workdir)),
                       workdir.name).ask()  # Its asker dies here.
  run = helpers.Watched(_command(str(sweep_file), workdir,
                                 '--lease_seconds=1'))
  assert run.wait() == 0, run.output[-3000:]
  assert 'trial-0000: taken over' in run.output
  [trial] = _trials(workdir)
  assert trial.state.name == 'COMPLETE'
  seed = study_lib.trial_seed(5, 0)
  assert trial.user_attrs[study_lib.SEED] == seed
  batch_size = trial.params['batch_size']
  config = json.loads((workdir / 'trial-0000' / 'config.json').read_text())
  assert (config['seed'], config['batch_size']) == (seed, batch_size)
