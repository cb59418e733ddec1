"""distribution.strategy='parameter_server': real jobs of a chief, workers
and a server on localhost, started by ctl.launch, and what is refused at
start."""

import csv
import json
import os
import random
import re
import signal
import socket
import time

import portpicker
import pytest

from ctl import config as config_lib
from ctl import errors
from ctl.cluster import distribution
from ctl.cluster import ps_cluster
from ctl.cluster import tf_config as cluster_lib
import helpers

PS = '--config.distribution.strategy=parameter_server'
TFRECORD = str(helpers.REPO / 'configs' / 'digits_tfrecord.py')


def _launch(workdir, *args: str, num_epochs: int = 2, restarts: int = 0,
            config: str = helpers.DIGITS,
            num_workers: int = 2) -> helpers.Watched:
  """ctl.launch of a chief, num_workers workers and one server training the
  digits task (44 steps an epoch), its CSV on."""
  return helpers.Watched([
      *helpers.ctl_command()[:2], 'ctl.launch', f'--num_workers={num_workers}',
      '--num_ps=1', f'--max_restarts={restarts}', '--', f'--config={config}',
      f'--workdir={workdir}', f'--config.num_epochs={num_epochs}',
      '--config.log_csv=True', *args])


def _iterations(workdir) -> int:
  """The Keras optimizer's step counter in the latest checkpoint."""
  tensors = helpers.checkpoint_tensors(
      workdir / 'checkpoints' / f'ckpt-{helpers.latest_checkpoint_step(workdir)}')
  (value,) = [value for name, value in tensors.items()
              if 'iterations' in name and 'optimizer' in name]
  return int(value)


def _attempt_output(job: helpers.Watched, attempt: int) -> str:
  """What ctl.launch printed in one attempt of the job (from its line
  naming the pids it started to the next attempt's)."""
  parts = re.split(r'\[launch\] attempt \d+: started workers', job.output)
  return parts[attempt] if attempt < len(parts) else ''


def _wait_in_attempt(job: helpers.Watched, attempt: int, pattern: str,
                     timeout: float = 300) -> re.Match:
  """Waits until a line of the job's attempt matches pattern (a line of an
  earlier attempt may match it too)."""
  deadline = time.monotonic() + timeout
  while not (match := re.search(pattern, _attempt_output(job, attempt))):
    if job.process.poll() is not None:
      job.wait()  # Every line read.
      match = re.search(pattern, _attempt_output(job, attempt))
      assert match, f'Output ended without {pattern!r}:\n{job.output[-3000:]}'
      return match
    assert time.monotonic() < deadline, (
        f'No {pattern!r} within {timeout} s:\n{job.output[-3000:]}')
    time.sleep(0.05)
  return match


def _csv_values(workdir, name: str) -> list[tuple[int, float]]:
  """metrics.csv's (step, value) rows of one name."""
  with open(workdir / 'metrics.csv', newline='') as file:
    return [(int(row['step']), float(row['value']))
            for row in csv.DictReader(file) if row['name'] == name]


@pytest.mark.slow
def test_a_chief_two_workers_and_a_server_train_digits(tmp_path):
  workdir = tmp_path / 'job'
  # strategy 'auto': the "ps" tasks choose it. A train metric counting
  # examples: Keras's own increments lose some when workers update at once.
  job = _launch(workdir,
                "--config.metrics=('accuracy', 'user_modules:Examples')")
  assert job.wait() == 0, job.output[-3000:]
  assert 'Coordinating 2 worker(s) and 1 parameter server(s)' in job.output
  results = helpers.read_results(workdir)
  # Exactly the configured steps, whatever the workers did; accuracy in the
  # band of a one-worker run of 2 epochs (tests/training/test_mirrored.py).
  assert results['step'] == 88, results
  assert results['eval']['accuracy'] > 0.9, results
  # Every example the workers trained on, counted once in each report.
  counts = _csv_values(workdir, 'train/examples')
  steps = [step for step, _ in counts]
  assert steps[-1] == 88, counts
  assert counts == [(step, 32.0 * (step - before))
                    for before, step in zip([0, *steps], steps)], counts
  # The schedule's counter is the run's step, not what the workers'
  # racing increments left of it.
  assert _iterations(workdir) == 88
  # Every task left by itself once the chief marked the job done.
  for name in ('worker 0', 'worker 1', 'ps 0'):
    assert f'[{name}] ' in job.output
  assert job.output.count('The chief marked the job done') == 3


@pytest.mark.slow
def test_workers_lost_mid_run_leave_the_step_count_exact(tmp_path):
  # Of 3 workers, worker 0 is SIGKILLed and worker 1 SIGTERMed (a
  # preemption notice) mid-run, each after a step drawn from the seed:
  # worker 2 runs the steps left.
  seed = random.randrange(2**31)
  print(f'seed {seed}')
  draw = random.Random(seed)
  kills = sorted([(draw.randrange(11, 55, 11), 0, signal.SIGKILL),
                  (draw.randrange(11, 55, 11), 1, signal.SIGTERM)])
  workdir = tmp_path / 'job'
  job = _launch(workdir, '--config.intervals.log_steps=11', num_workers=3)
  pids = [int(pid) for pid in job.wait_for(
      r'started workers with pids \[\d+, (\d+), (\d+)').groups()]
  for kill_after, worker, signum in kills:
    job.wait_for(rf'\[chief\] .*step {kill_after}/88', timeout=300)
    os.kill(pids[worker], signum)
  assert job.wait() == 0, job.output[-3000:]
  assert helpers.read_results(workdir)['step'] == 88
  # The SIGTERMed worker, a preemption notice, left cleanly.
  assert ('[worker 1] ctl: preempted: SIGTERM: worker:1 left the job'
          in job.output)


@pytest.mark.slow
def test_a_sigtermed_chief_saves_exits_42_and_the_same_command_resumes(
    tmp_path):
  # Workers training from the task's tf.data pipeline of TFRecord files,
  # made again on each worker; the shards written by the chief on first
  # use.
  workdir = tmp_path / 'job'
  args = ('--config.intervals.log_steps=11',
          '--config.data.tfrecord.order=by_file',
          f'--config.data.tfrecord.dir={tmp_path / "shards"}')
  job = _launch(workdir, *args, num_epochs=4, config=TFRECORD)  # 176 steps.
  chief = int(job.wait_for(r'started workers with pids \[(\d+)')[1])
  job.wait_for(r'\[chief\] .*step 22/176', timeout=300)
  os.kill(chief, signal.SIGTERM)
  assert job.wait() == 42, job.output[-3000:]
  saved = helpers.latest_checkpoint_step(workdir)
  assert 22 <= saved < 176
  assert f'Stopped by SIGTERM after step {saved} of 176' in job.output
  again = _launch(workdir, *args, num_epochs=4, config=TFRECORD)
  assert again.wait() == 0, again.output[-3000:]
  assert f'Training from step {saved} to 176' in again.output
  results = helpers.read_results(workdir)
  assert results['step'] == 176, results  # 44 steps a pass, as in memory.
  assert results['eval']['accuracy'] > 0.9, results


@pytest.mark.slow
@pytest.mark.parametrize('stop', ['timeout', 'sigterm'])
def test_with_every_worker_gone_the_chief_stops_in_bounded_time(tmp_path,
                                                                 stop):
  # TensorFlow's join() waits up to an hour for a lost worker to come back:
  # ctl waits distribution.timeout_seconds for a loop (then 43), and at most
  # 20 s once SIGTERM came (then 42; with a timeout longer than that, or the
  # timeout would end the wait first), and the latest checkpoint stays.
  workdir = tmp_path / 'job'
  timeout = 20 if stop == 'timeout' else 60
  job = _launch(workdir, '--config.intervals.log_steps=11',
                f'--config.distribution.timeout_seconds={timeout}',
                num_epochs=40)
  chief, *workers = [int(pid) for pid in job.wait_for(
      r'started workers with pids \[(\d+), (\d+), (\d+)').groups()]
  job.wait_for(r'\[chief\] .*step 22/1760', timeout=300)
  for worker in workers:
    os.kill(worker, signal.SIGKILL)
  if stop == 'sigterm':
    os.kill(chief, signal.SIGTERM)
    assert job.wait(timeout=120) == errors.EXIT_PREEMPTED, job.output[-3000:]
    # Or, where the loop in flight had finished before the workers died,
    # the usual save at its end.
    assert re.search(r'\[chief\] ctl: preempted: SIGTERM: the loop in flight '
                     r'did not finish within 20 s|Stopped by SIGTERM after '
                     r'step', job.output), job.output[-3000:]
  else:
    assert job.wait(timeout=300) == errors.EXIT_PEER_FAILED, (
        job.output[-3000:])
    assert ('[chief] ctl: error: No worker finished the loop in flight '
            'within distribution.timeout_seconds=20: every worker is gone '
            'or hung.' in job.output), job.output[-3000:]
  assert helpers.latest_checkpoint_step(workdir) < 1760


@pytest.mark.slow
def test_a_lost_server_stops_the_chief_with_43_naming_it_then_it_resumes(
    tmp_path):
  # In attempt 1 the server is lost in a loop of steps: the runner's join
  # notices. In attempt 2 it is lost between a loop and the evaluation
  # after it: the evaluation's or the save's read of a variable does (a
  # TypeError of ctl's exited 1 there, CI stop 53). ctl.launch starts the
  # job again each time.
  workdir = tmp_path / 'job'
  job = _launch(workdir, '--config.intervals.log_steps=11', num_epochs=4,
                restarts=2)
  server = int(_wait_in_attempt(
      job, 1, r'with pids \[\d+, \d+, \d+, (\d+)\]', timeout=120)[1])
  _wait_in_attempt(job, 1, r'\[chief\] .*Saved .*ckpt-44')
  os.kill(server, signal.SIGKILL)
  chief, server = map(int, _wait_in_attempt(
      job, 2, r'with pids \[(\d+), \d+, \d+, (\d+)\]').groups())
  resumed = int(_wait_in_attempt(
      job, 2, r'\[chief\] .*Training from step (\d+) to 176')[1])
  epoch_end = (resumed // 44 + 1) * 44
  assert epoch_end < 176, resumed
  _wait_in_attempt(job, 2, rf'\[chief\] .*step {epoch_end}/176')
  os.kill(chief, signal.SIGSTOP)  # Before its evaluation reads much.
  os.kill(server, signal.SIGKILL)
  helpers.wait_until_gone(server)  # Its sockets closed.
  os.kill(chief, signal.SIGCONT)
  code = job.wait()
  assert code == 0, '\n'.join(  # The chief's last lines: its traceback.
      line for line in job.output.splitlines()
      if line.startswith(('[chief]', '[launch]')) and not any(
          noise in line for noise in ('GRPC', 'grpc', 'remote target',
                                      'function remotely')))[-6000:]
  for attempt in (1, 2):
    output = _attempt_output(job, attempt)
    assert ('[chief] ctl: error: The parameter server(s) ps:0 stopped '
            'answering' in output), output[-3000:]
    assert f'attempt {attempt}: workers exited with [43, ' in output
  starts = re.findall(r'\[chief\] .*Training from step (\d+) to 176',
                      job.output)
  assert len(starts) == 3, starts  # Resumed each time.
  assert int(starts[1]) >= 44 and int(starts[2]) >= int(starts[1]), starts
  assert helpers.read_results(workdir)['step'] == 176


def test_any_error_while_a_server_is_gone_is_a_lost_server():
  # Whatever the error a lost server causes, the servers decide.
  port = portpicker.pick_unused_port()
  cluster = cluster_lib.from_tf_config(json.dumps({
      'cluster': {'chief': ['localhost:1'], 'worker': ['localhost:2'],
                  'ps': [f'localhost:{port}']},
      'task': {'type': 'chief', 'index': 0}}))
  failure = ps_cluster.lost_server_failure(cluster)
  assert isinstance(failure, errors.PeerFailure), failure
  assert 'ps:0 stopped answering' in str(failure)
  with socket.create_server(('localhost', port)):
    assert ps_cluster.lost_server_failure(cluster) is None  # It listens.
  assert ps_cluster.lost_server_failure(None) is None  # Not a PS job.


def _config(**fields):
  return helpers.override(helpers.load_config_file(helpers.DIGITS),
                          **{'distribution.strategy': 'parameter_server',
                             **fields})


@pytest.mark.parametrize('fields, expected', [
    ({'deterministic': True}, 'config.deterministic=True cannot work'),
    ({'jit_compile': 'loop'}, "config.jit_compile='loop' cannot work"),
    ({'accumulate_steps': 2}, 'config.accumulate_steps=2 cannot work'),
])
def test_what_parameter_servers_cannot_do_is_refused(fields, expected):
  with pytest.raises(errors.ConfigError, match=expected):
    config_lib.validate(_config(**fields))


def test_deterministic_parameter_servers_stop_with_one_line(tmp_path):
  run = helpers.run_ctl(f'--config={helpers.DIGITS}', PS,
                        '--config.deterministic=True',
                        f'--workdir={tmp_path / "w"}')
  assert run.returncode == 2
  assert run.stderr.strip().splitlines()[-1].startswith(
      'ctl: error: config.deterministic=True cannot work with '
      "distribution.strategy='parameter_server'")
  assert not (tmp_path / 'w').exists()


def _tf_config(jobs: dict, task_type: str) -> str:
  return json.dumps({
      'cluster': {job: [f'localhost:{portpicker.pick_unused_port()}'
                        for _ in range(count)] for job, count in jobs.items()},
      'task': {'type': task_type, 'index': 0}})


@pytest.mark.parametrize('strategy, jobs, expected', [
    ('parameter_server', None, 'needs a cluster'),
    ('parameter_server', {'worker': 2, 'ps': 1}, 'it has no "chief"'),
    ('parameter_server', {'chief': 1, 'worker': 1}, 'it has no "ps"'),
    ('multi_worker', {'chief': 1, 'worker': 1, 'ps': 1},
     'names "ps" tasks'),
])
def test_a_cluster_parameter_servers_cannot_run_is_refused(
    monkeypatch, strategy, jobs, expected):
  if jobs is None:
    monkeypatch.delenv('TF_CONFIG', raising=False)
  else:
    monkeypatch.setenv('TF_CONFIG', _tf_config(jobs, 'worker'))
  config = _config(**{'distribution.strategy': strategy})
  with pytest.raises(errors.ConfigError, match=expected) as raised:
    distribution.build_strategy(config.distribution)
  assert '\n' not in str(raised.value)


@pytest.mark.slow
def test_a_sigtermed_server_says_what_its_leaving_means(tmp_path):
  # A server's leaving stops the job (its variables were there), unlike a
  # worker's: its line must not say that others run its steps.
  ports = [portpicker.pick_unused_port() for _ in range(3)]
  tf_config = {'cluster': {'chief': [f'localhost:{ports[0]}'],
                           'worker': [f'localhost:{ports[1]}'],
                           'ps': [f'localhost:{ports[2]}']},
               'task': {'type': 'ps', 'index': 0}}
  server = helpers.Watched(
      helpers.ctl_command(f'--config={helpers.DIGITS}', PS,
                          f'--workdir={tmp_path / "job"}'),
      env=helpers.env_with(TF_CONFIG=json.dumps(tf_config)))
  # Its handler is in place before that line (ps_cluster.serve).
  server.wait_for('Serving as ps:0')
  server.process.send_signal(signal.SIGTERM)
  assert server.wait(timeout=120) == 42, server.output[-3000:]
  assert 'ctl: preempted: SIGTERM: ps:0 left the job; a chief still ' \
      'training stops with exit 43 naming it' in server.output
  assert 'other workers' not in server.output


@pytest.mark.slow
def test_a_server_whose_chief_never_answers_leaves_with_43(tmp_path):
  # No one else ends a Slurm step's tasks: a worker or server whose chief
  # is gone (here: never started) leaves by itself, in bounded time.
  run = helpers.run_ctl(
      f'--config={helpers.DIGITS}',
      '--config.distribution.startup_timeout_seconds=5',
      f'--workdir={tmp_path / "w"}',
      env=helpers.env_with(TF_CONFIG=_tf_config(
          {'chief': 1, 'worker': 1, 'ps': 1}, 'ps')), timeout=300)
  assert run.returncode == errors.EXIT_PEER_FAILED, run.stderr[-3000:]
  last = run.stderr.strip().splitlines()[-1]
  assert last.startswith('ctl: error: The chief (chief:0 at localhost:'), last
  assert ('has not answered for 5 s (distribution.startup_timeout_seconds) '
          'and did not mark the job done: ps:0 leaves') in last
