"""MLflow logging against a real tracking server started here (SQLite
backend, artifacts served by it), read back with MlflowClient: one MLflow
run per ctl run, continued after a SIGKILL and a restart without a step
logged twice; a sweep's trials as children of one parent run."""

import csv
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import urllib.request

from mlflow import tracking
import portpicker
import pytest

from ctl import errors
import helpers

FLAGS = (f'--config={helpers.DIGITS}:smoke', '--config.deterministic=True',
         '--config.intervals.log_steps=4', '--config.intervals.eval_steps=20',
         '--config.log_csv=True')


@pytest.fixture(scope='module')
def server_directory(tmp_path_factory):
  """The server's database and artifacts."""
  return tmp_path_factory.mktemp('mlflow')


def _server_processes(directory: pathlib.Path) -> list[int]:
  """The server's processes: `mlflow server`, and its uvicorn and job
  runner, which name the database in their environment only."""
  database = str(directory / 'mlflow.db').encode()
  found = []
  for entry in os.listdir('/proc'):
    try:
      with open(f'/proc/{entry}/cmdline', 'rb') as command, open(
          f'/proc/{entry}/environ', 'rb') as environment:
        if database in command.read() or database in environment.read():
          found.append(int(entry))
    except (OSError, ValueError):
      continue
  return found


def _start_server(directory: pathlib.Path) -> tuple[helpers.Watched, str]:
  """An MLflow server listening on a free port; retried on another port when
  the one picked was taken before the server bound it (it then exits)."""
  for _ in range(3):
    port = portpicker.pick_unused_port()
    job = helpers.Watched([
        sys.executable, '-m', 'mlflow', 'server', '--host', '127.0.0.1',
        '--port', str(port), '--workers', '1',
        '--backend-store-uri', f'sqlite:///{directory / "mlflow.db"}',
        '--artifacts-destination', str(directory / 'artifacts')], server=True)
    try:
      # uvicorn says "Application startup complete" before it binds the
      # port, "Uvicorn running on" after; gunicorn's "Listening at" after.
      job.wait_for('Uvicorn running on|Listening at', timeout=180)
      return job, f'http://127.0.0.1:{port}'
    except AssertionError:
      if job.process.poll() is None:
        raise  # Not a lost port: the server hangs.
  raise AssertionError(f'MLflow did not start:\n{job.output[-3000:]}')


@pytest.fixture(scope='module')
def server(server_directory):
  """An MLflow tracking server on localhost; its URI."""
  directory = server_directory
  job, uri = _start_server(directory)
  try:
    with urllib.request.urlopen(f'{uri}/health', timeout=30) as reply:
      assert reply.status == 200
    yield uri
  finally:
    # The server runs uvicorn in a process of its own: stop both.
    for pid in [job.process.pid, *_server_processes(directory)]:
      try:
        os.kill(pid, signal.SIGCONT)  # A test that stopped it failed.
        os.kill(pid, signal.SIGTERM)
      except ProcessLookupError:
        pass
    try:
      job.wait(timeout=30)
    except subprocess.TimeoutExpired:
      job.kill()


def _run_of(client, workdir: pathlib.Path):
  runs = client.search_runs(
      [experiment.experiment_id for experiment in client.search_experiments()],
      filter_string=f"tags.`ctl.workdir` = '{os.path.abspath(workdir)}'")
  assert len(runs) == 1, [run.info.run_id for run in runs]
  return runs[0]


def _csv_values(workdir: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
  values = {}
  with open(workdir / 'metrics.csv', newline='') as file:
    for row in csv.DictReader(file):
      values.setdefault(row['name'], []).append(
          (int(row['step']), float(row['value'])))
  return values


@pytest.mark.slow
def test_a_killed_run_continues_its_mlflow_run_without_repeating_steps(
    server, server_directory, tmp_path):
  # One workdir, killed twice: once with the server up, once while it is
  # stopped (values logged then survive the kill in the pending file).
  seed = random.randrange(1 << 16)
  print(f'seed {seed}')
  flags = (*FLAGS, f'--config.mlflow.tracking_uri={server}',
           '--config.mlflow.experiment=resume',
           '--config.intervals.checkpoint_steps=20',
           '--config.intervals.async_checkpoint=False')
  workdir = tmp_path / 'run'
  # A SIGKILL after step 32: the restart trains steps 21..32 (or all from
  # step 0) again, which MLflow has already.
  job = helpers.Watched(helpers.ctl_command(*flags, f'--workdir={workdir}'))
  job.wait_for('MLflow: run ', timeout=600)  # TensorFlow started.
  job.wait_for(r'step 32/88 ')
  job.kill()
  client = tracking.MlflowClient(server)
  assert _run_of(client, workdir).info.status == 'RUNNING'
  job = helpers.Watched(helpers.ctl_command(*flags, f'--workdir={workdir}'))
  job.wait_for('MLflow: continuing run', timeout=600)
  assert int(job.wait_for(r'Training from step (\d+)')[1]) < 32
  job.wait_for(r'step 36/88 ')
  stopped_at, kill_at = _stop_server_and_kill(job, server_directory, seed)
  assert (workdir / 'mlflow_pending.jsonl').stat().st_size > 0

  resumed = helpers.run_ctl(*flags, f'--workdir={workdir}')
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'MLflow: continuing run' in resumed.stderr
  resumed_from = int(re.search(r'Training from step (\d+)', resumed.stderr)[1])
  assert stopped_at < resumed_from < kill_at  # Steps between were lost.
  run = _run_of(client, workdir)
  assert run.info.status == 'FINISHED'
  assert run.info.run_name == workdir.name
  assert run.data.params['optimizer.learning_rate'] == str(
      helpers.load_config('digits', 'smoke').optimizer.learning_rate)
  _assert_logged_once_as_in_csv(client, run.info.run_id, workdir)
  assert not (workdir / 'mlflow_pending.jsonl').exists()
  assert 'eval/accuracy' in run.data.metrics
  exported = {item.path for item in client.list_artifacts(run.info.run_id,
                                                          'export')}
  assert 'export/saved_model' in exported
  assert 'export/model.keras' in exported


def _stop_server_and_kill(job, server_directory, seed) -> tuple[int, int]:
  """Stops the server (SIGSTOP); while it is stopped, the job trains past
  a checkpoint and is killed. The steps stopped and killed at."""
  stopped = _server_processes(server_directory)
  try:
    for pid in stopped:
      os.kill(pid, signal.SIGSTOP)
    stopped_at = max(map(int, re.findall(r'step (\d+)/88 ', job.output)))
    # Training goes on while the server does not answer: 4 or more log
    # lines and a checkpoint later, it is killed.
    next_checkpoint = (stopped_at // 20 + 1) * 20
    kill_at = max(next_checkpoint + 4, stopped_at + 16) + 4 * random.Random(
        seed).randint(0, 3)
    assert kill_at < 88, job.output[-3000:]
    job.wait_for(rf'step {kill_at}/88 ')
    job.kill()
  finally:
    for pid in stopped:
      os.kill(pid, signal.SIGCONT)
  return stopped_at, kill_at


def _assert_logged_once_as_in_csv(client, run_id, workdir):
  """Every value of metrics.csv in MLflow, once, at its step."""
  for name, rows in _csv_values(workdir).items():
    if name.startswith('workers/'):
      continue  # Each worker's timings: TensorBoard and the CSV only.
    history = client.get_metric_history(run_id, name)
    logged = sorted((entry.step, entry.value) for entry in history)
    assert [step for step, _ in logged] == [step for step, _ in rows], name
    if 'per_second' not in name:  # Speeds differ run to run.
      assert [value for _, value in logged] == pytest.approx(
          [value for _, value in rows]), name


@pytest.mark.slow
def test_values_of_a_run_that_ended_while_the_server_was_stopped_are_sent(
    server, server_directory, tmp_path):
  # They stayed in mlflow_pending.jsonl for good: the same command again
  # said "already finished" and sent none; the MLflow run stayed RUNNING.
  flags = (*FLAGS, f'--config.mlflow.tracking_uri={server}',
           '--config.mlflow.experiment=ended-in-outage')
  workdir = tmp_path / 'run'
  # A short end wait, and short requests for the export's upload after it:
  # the lengths of the waits are not what is tested.
  job = helpers.Watched(
      helpers.ctl_command(*flags, f'--workdir={workdir}',
                          '--config.mlflow.end_wait_seconds=3'),
      helpers.env_with(MLFLOW_HTTP_REQUEST_TIMEOUT='5',
                       MLFLOW_HTTP_REQUEST_MAX_RETRIES='1'))
  job.wait_for('MLflow: run ', timeout=600)
  job.wait_for(r'step 8/88 ')
  stopped = _server_processes(server_directory)
  try:
    for pid in stopped:
      os.kill(pid, signal.SIGSTOP)
    # The end waits a bounded time for the server, then keeps the values.
    assert job.wait() == 0, job.output[-3000:]
  finally:
    for pid in stopped:
      os.kill(pid, signal.SIGCONT)
  assert 'MLflow did not take the last' in job.output
  assert 'within 3 s' in job.output  # config.mlflow.end_wait_seconds
  assert (workdir / 'mlflow_pending.jsonl').stat().st_size > 0
  client = tracking.MlflowClient(server)
  assert _run_of(client, workdir).info.status == 'RUNNING'

  again = helpers.run_ctl(*flags, f'--workdir={workdir}')
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'Training already finished' in again.stderr
  run = _run_of(client, workdir)
  assert run.info.status == 'FINISHED'
  _assert_logged_once_as_in_csv(client, run.info.run_id, workdir)
  assert not (workdir / 'mlflow_pending.jsonl').exists()


@pytest.mark.slow
def test_a_sweeps_trials_are_children_of_one_parent_run(server, tmp_path):
  sweep_file = tmp_path / 'my_sweep.py'
  sweep_file.write_text(
      'from ctl import hyper\n\n'
      'def get_sweep():\n'
      f'  return hyper.Sweep(config={helpers.DIGITS + ":smoke"!r},\n'
      '      trials=hyper.product(\n'
      "          hyper.sweep('optimizer.learning_rate', [0.01, 0.03]),\n"
      "          hyper.fixed({'mlflow.tracking_uri': " f'{server!r},\n'
      "                       'mlflow.experiment': 'sweep',\n"
      "                       'export.at_end': False,\n"
      "                       'num_epochs': 1})),\n"
      "      metric='eval.accuracy')\n")
  command = [sys.executable, '-m', 'ctl.sweep', f'--sweep={sweep_file}',
             f'--workdir={tmp_path / "sweep"}']
  for _ in range(2):  # Run again: the finished trials are skipped.
    sweep = subprocess.run(command, cwd=helpers.REPO, env=helpers.env_with(),
                           capture_output=True, text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stderr[-3000:]

  client = tracking.MlflowClient(server)
  experiment = client.get_experiment_by_name('sweep')
  runs = client.search_runs([experiment.experiment_id])
  parents = [run for run in runs if 'mlflow.parentRunId' not in run.data.tags]
  assert len(parents) == 1 and len(runs) == 3
  parent = parents[0]
  assert parent.info.status == 'FINISHED'
  children = [run for run in runs if run is not parent]
  assert {run.data.tags['mlflow.parentRunId'] for run in children} == {
      parent.info.run_id}
  assert sorted(run.data.params['optimizer.learning_rate']
                for run in children) == ['0.01', '0.03']
  assert all(run.info.status == 'FINISHED' for run in children)
  assert [item.path for item in client.list_artifacts(
      parent.info.run_id)] == ['results.csv']


def test_an_unreachable_server_stops_the_run_before_training(tmp_path):
  with helpers.refusing_port() as port:
    run = helpers.run_ctl(
        *FLAGS, f'--workdir={tmp_path / "run"}',
        f'--config.mlflow.tracking_uri=http://127.0.0.1:{port}',
        env=helpers.env_with(MLFLOW_HTTP_REQUEST_MAX_RETRIES='0'))
    assert run.returncode == errors.EXIT_FAILURE
    assert run.stderr.count('ctl: error: ') == 1
    assert (f'MLflow tracking server http://127.0.0.1:{port} cannot be '
            'reached') in run.stderr
    assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_two_workers_log_once_to_mlflow(server, tmp_path):
  # The chief alone logs; every worker holds the action (the loop agrees a
  # chief-only action's requests on all workers).
  workdir = tmp_path / 'run'
  codes = helpers.run_workers(
      [*FLAGS, f'--config.mlflow.tracking_uri={server}',
       '--config.mlflow.experiment=two_workers', f'--workdir={workdir}',
       '--config.export.at_end=False'],  # Uploaded: see the first test.
      helpers.cluster_envs(2), tmp_path)
  logs = '\n'.join(path.read_text()[-3000:]
                   for path in sorted(tmp_path.glob('worker*.log')))
  assert codes == [0, 0], logs
  client = tracking.MlflowClient(server)
  run = _run_of(client, workdir)
  assert run.info.status == 'FINISHED'
  _assert_logged_once_as_in_csv(client, run.info.run_id, workdir)
