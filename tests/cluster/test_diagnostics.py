"""Seeing into a job: a hung worker named, SIGUSR1 dumps, `ctl.status`.

Real workers and real signals: worker 1 dumps on SIGUSR1 and trains on,
then is stopped for good (SIGSTOP); worker 0's watchdog ends the job and
its error line names worker 1; ctl.status reads the workdir throughout.
"""

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from ctl import errors
from ctl.cluster import stragglers
from ctl.cluster import worker_status
from ctl.cluster import worker_timings
from ctl.status import verdict
import helpers

TIMEOUT_SECONDS = 15
NOISY = helpers.REPO / 'tests' / 'configs' / 'noisy_regression.py'
ARGS = (f'--config={helpers.DIGITS}', '--config.num_epochs=200',
        '--config.steps_per_loop=4', '--config.intervals.log_steps=4',
        f'--config.distribution.timeout_seconds={TIMEOUT_SECONDS}')


def ctl_status(workdir) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', 'ctl.status', str(workdir)],
                        cwd=helpers.REPO, env=helpers.env_with(),
                        capture_output=True, text=True, timeout=120)


def wait_for_file(path, process, timeout=120) -> str:
  """The file's text once it exists, while process runs."""
  deadline = time.monotonic() + timeout
  while not path.exists():
    assert process.poll() is None, 'exited before writing ' + str(path)
    assert time.monotonic() < deadline, f'no {path} within {timeout} s'
    time.sleep(0.05)
  return path.read_text()


def wait_for_step(worker: helpers.Watched, step: int, timeout=120) -> None:
  """Waits until the worker logged a step at or after `step`."""
  deadline = time.monotonic() + timeout
  while max(map(int, re.findall(r' step (\d+)/', worker.output)),
            default=0) < step:
    assert worker.process.poll() is None, worker.output[-3000:]
    assert time.monotonic() < deadline, f'no step {step} within {timeout} s'
    time.sleep(0.05)


@pytest.mark.slow
def test_a_stopped_worker_is_named_with_the_stacks_and_sigusr1_dumps(
    tmp_path):
  workdir = tmp_path / 'workdir'
  workers = [helpers.Watched(helpers.ctl_command(*ARGS,
                                                 f'--workdir={workdir}'), env)
             for env in helpers.cluster_envs(2)]
  try:
    workers[1].wait_for(r'step 8/')
    running = ctl_status(workdir)
    assert running.returncode == 0, running.stderr[-3000:]
    assert ': RUNNING: training' in running.stdout
    assert 'workers (2):' in running.stdout

    # SIGUSR1: a dump, and training goes on.
    victim = workers[1].process
    victim.send_signal(signal.SIGUSR1)
    dump = wait_for_file(
        workdir / 'diagnostics' / f'worker-1-{victim.pid}.txt', victim)
    assert 'SIGUSR1 asked' in dump
    assert '--- Thread MainThread' in dump
    assert re.search(r'  worker 0 \(\S+, pid \d+\): running', dump)
    step = int(re.search(r'This worker: .* step (\d+)', dump).group(1))
    wait_for_step(workers[1], step + 8)

    # Stopped for good: worker 0 names it.
    victim.send_signal(signal.SIGSTOP)
    assert workers[0].wait(timeout=TIMEOUT_SECONDS + 120) == (
        errors.EXIT_PEER_FAILED)
    [line] = [line for line in workers[0].output.splitlines()
              if line.startswith('ctl: error:')]
    # TensorFlow's gRPC may give up before the watchdog, while worker 1's
    # status is still recent: then it is named as behind.
    assert re.search(r'Stopped making progress: worker 1 \(\S+, pid '
                     rf'{victim.pid}\): running, phase [\w -]+, step \d+.*: '
                     r'(its status stopped changing|behind this worker)',
                     line), line
    chief_dump = workdir / 'diagnostics' / (
        f'worker-0-{workers[0].process.pid}.txt')
    assert str(chief_dump) in line
    stacks = chief_dump.read_text()
    # Whichever ended the wait (TensorFlow's gRPC or the watchdog), the
    # dump shows where the main thread waited: in the loop of steps (the
    # watchdog's, in its stack; TensorFlow's, in its error's traceback).
    assert re.search(r'(no progress for distribution.timeout_seconds=15|'
                     r'TensorFlow reported a lost peer)', stacks), stacks
    assert 'in _train' in stacks, stacks
    assert '--- Thread MainThread' in stacks
    assert re.search(r'  worker 1 \(\S+, pid \d+\): running.*status \d+ s '
                     'old', stacks)

    failed = ctl_status(workdir)
    assert failed.returncode == 0, failed.stderr[-3000:]
    assert ': FAILED: worker 0 exited with code 43' in failed.stdout
    assert f'latest diagnostics: {chief_dump}' in failed.stdout
  finally:
    for worker in workers:
      worker.kill()


@pytest.mark.slow
def test_a_worker_slowed_by_half_is_named_as_the_straggler_then_recovers(
    tmp_path):
  seed = int(os.environ.get('CTL_STRAGGLER_SEED', random.randrange(10**6)))
  print(f'seed {seed} (CTL_STRAGGLER_SEED={seed} reproduces it)')
  slow_from = random.Random(seed).randrange(40, 200)
  # A report every 22 steps: each spans a SIGSTOP once slowed.
  workers = [helpers.Watched(helpers.ctl_command(
      *ARGS[:-2], '--config.intervals.log_steps=22',
      '--config.intervals.summary_steps=22',
      '--config.distribution.timeout_seconds=120',
      f'--workdir={tmp_path}'), env) for env in helpers.cluster_envs(2)]
  chief, victim = workers[0], workers[1].process
  slowed = threading.Event()

  def stop_half_the_time():
    while slowed.is_set():
      victim.send_signal(signal.SIGSTOP)
      time.sleep(0.15)
      victim.send_signal(signal.SIGCONT)
      time.sleep(0.15)

  try:
    wait_for_step(chief, slow_from)
    assert 'Straggler' not in chief.output  # Nothing while workers are even.
    reports_before = len(re.findall(r' step \d+/', chief.output))
    slowed.set()
    duty = threading.Thread(target=stop_half_the_time, daemon=True)
    duty.start()
    named = chief.wait_for(r'Straggler: worker (\d+) \(\S+, pid (\d+)\) is '
                           r'compute-bound')
    assert named.groups() == ('1', str(victim.pid))
    reports = len(re.findall(r' step \d+/', chief.output)) - reports_before
    print(f'named after {reports} reports: {named.group(0)}')
    # Within 4 windows of 3 reports: one report of a busy machine in which
    # the stops fell unevenly starts the window again.
    assert reports <= 12, f'named after {reports} reports'
    slowed.clear()
    duty.join()
    chief.wait_for(rf'Worker 1 \(\S+, pid {victim.pid}\) is no longer a '
                   'straggler')
    assert 'Straggler: worker 0' not in chief.output
  finally:
    slowed.clear()
    for worker in workers:
      if worker.process.poll() is None:
        worker.process.send_signal(signal.SIGCONT)
      worker.kill()


@pytest.mark.slow
def test_a_worker_whose_input_pipeline_is_slow_is_named_input_bound(tmp_path):
  # Of 3 workers, worker 1 waits 50 ms for each batch from the first step;
  # its steps do little else, so only its input wait tells it from the
  # others, and neither of them is named.
  workers = [helpers.Watched(helpers.ctl_command(
      f'--config={NOISY}:SlowInputOnOneWorker', '--config.batch_size=48',
      '--config.num_epochs=1000', '--config.steps_per_loop=4',
      '--config.intervals.log_steps=4', '--config.intervals.checkpoint_steps=0',
      '--config.log_csv=True', f'--workdir={tmp_path}'), env)
             for env in helpers.cluster_envs(3, CTL_SLOW_INPUT_WORKER='1')]
  chief = workers[0]
  try:
    named = chief.wait_for(r'Straggler: worker (\d+) \(\S+, pid (\d+)\) is '
                           r'(\S+) \(.*: ([\d.]+) s waiting for input')
    print(next(line for line in chief.output.splitlines()
               if 'Straggler:' in line))
    assert named.groups()[:3] == ('1', str(workers[1].process.pid),
                                  'input-bound')
    assert 'Straggler: worker 0' not in chief.output
    assert 'Straggler: worker 2' not in chief.output
    # ctl.status judges the last reports afresh, where the chief's line
    # stays until a window without a slow report: a report in which the
    # machine was busier (a loop longer than 5 times worker 1's wait, e.g.
    # while ctl.status itself starts) can make a window show none.
    deadline = time.monotonic() + 120
    while not re.search(r'stragglers: worker 1 \(\S+, pid \d+, input-bound\)',
                        (status := ctl_status(tmp_path)).stdout):
      assert time.monotonic() < deadline, status.stdout
    # Each worker's timings: in TensorBoard, and in metrics.csv with a later
    # report, under the steps of their reports.
    deadline = time.monotonic() + 120
    while 'workers/1/input_wait_ms' not in (
        (tmp_path / 'metrics.csv').read_text()
        if (tmp_path / 'metrics.csv').exists() else ''):
      assert chief.process.poll() is None, chief.output[-3000:]
      assert time.monotonic() < deadline, 'no worker timings in metrics.csv'
      time.sleep(0.05)
    rows = _csv_values(tmp_path / 'metrics.csv')
    scalars = helpers.read_scalars(tmp_path / 'workers')
    for index in (0, 1, 2):
      for name in ('loops_ms', 'work_ms', 'input_wait_ms', 'actions_ms'):
        tag = f'workers/{index}/{name}'
        written = dict(scalars[tag])  # In float32.
        assert [written.get(step) for step, _ in rows[tag]] == pytest.approx(
            [value for _, value in rows[tag]], rel=1e-6), tag
    waited = {index: sum(value for _, value in
                         scalars[f'workers/{index}/input_wait_ms'])
              for index in (0, 1, 2)}
    assert waited[1] > 10 * max(waited[0], waited[2]), waited
  finally:
    for worker in workers:
      worker.kill()


@pytest.mark.slow
def test_status_of_a_sigtermed_then_finished_run_and_of_no_run(tmp_path):
  args = (f'--config={helpers.DIGITS}', '--config.num_epochs=2',
          '--config.intervals.log_steps=4', '--config.steps_per_loop=4')
  job, code, _ = helpers.sigterm_after(
      lambda attempt: helpers.Watched(helpers.ctl_command(
          *args, f'--workdir={tmp_path / str(attempt)}')),
      r'step 8/', 88)
  assert code == errors.EXIT_PREEMPTED, job.output[-3000:]
  workdir = tmp_path / re.search(r'--workdir=\S+/(\d+)',
                                 ' '.join(job.process.args)).group(1)
  stopped = ctl_status(workdir)
  assert stopped.returncode == 0, stopped.stderr[-3000:]
  assert re.search(r': STOPPED: worker 0 exited with code 42: preempted: '
                   r'Stopped by SIGTERM after step \d+ of 88',
                   stopped.stdout), stopped.stdout
  assert 'last checkpoint: step' in stopped.stdout

  resumed = helpers.run_ctl(*args, f'--workdir={workdir}')
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  finished = ctl_status(workdir)
  assert ': FINISHED: training finished (exit code 0)' in finished.stdout
  assert 'step 88 of 88, epoch 2 of 2' in finished.stdout
  assert re.search(r'best accuracy: [\d.]+ at step \d+', finished.stdout)

  nothing = ctl_status(tmp_path / 'nothing')
  assert nothing.returncode == errors.EXIT_USAGE
  assert nothing.stderr.startswith(
      f'ctl: error: {tmp_path / "nothing"} is not a ctl workdir')


def _csv_values(path) -> dict[str, list[tuple[int, float]]]:
  """{name: [(step, value), ...]} of metrics.csv."""
  values = {}
  for line in path.read_text().splitlines()[1:]:
    step, name, value = line.split(',')
    values.setdefault(name, []).append((int(step), float(value)))
  return values


def _status(index, *, step=40, age=1.0, progress_age=1.0, state='running',
            phase='training', now=1000.0):
  """A worker's status as its file holds it."""
  return {'worker': index, 'num_workers': 2, 'host': 'h', 'pid': 100 + index,
          'state': state, 'phase': phase, 'step': step, 'reason': None,
          'exit_code': None, 'time': now - age,
          'progress_time': now - progress_age, 'timeout_seconds': 20.0,
          'heartbeat_seconds': 5.0}


def _run_state(workers: dict, now: float) -> tuple[str, str]:
  """ctl.status's verdict on these statuses (of another host: no /proc)."""
  return verdict.run_state(
      workers, {index: verdict.condition(status, now)
                for index, status in workers.items()}, None)


def test_hung_is_a_status_that_stopped_changing_or_a_worker_without_progress():
  now = 1000.0
  fresh = {0: _status(0), 1: _status(1, age=12.0)}  # Under 3 heartbeats.
  assert _run_state(fresh, now) == ('running', 'training')
  stale = {0: _status(0), 1: _status(1, age=21.0)}
  assert _run_state(stale, now) == (
      'hung', 'worker 1 (h, pid 101) is silent: its status stopped changing '
      '0:00:21 ago (stopped, dead or cut off)')
  stuck = {0: _status(0, progress_age=30.0), 1: _status(1)}
  assert _run_state(stuck, now) == (
      'hung', 'worker 0 (h, pid 100) is stalled: it made no progress for '
      '0:00:30, over its timeout of 20 s')


def test_the_peer_named_is_the_one_whose_status_stopped_or_lags():
  now = 1000.0
  me = _status(0, progress_age=20.0)
  assert worker_status.stalled_peers(
      {0: me, 1: _status(1, age=12.0)}, 0, now)[0].endswith(
          'its status stopped changing (stopped, dead or unreachable)')
  assert 'behind this worker\'s step 40' in worker_status.stalled_peers(
      {0: me, 1: _status(1, step=36)}, 0, now)[0]
  assert worker_status.stalled_peers({0: me, 1: None}, 0, now) == [
      'worker 1: wrote no status (it never started training)']
  assert 'in another phase' in worker_status.stalled_peers(
      {0: me, 1: _status(1, phase='evaluate')}, 0, now)[0]
  assert worker_status.stalled_peers({0: me, 1: _status(1)}, 0, now) == []


def _reports(own_seconds, wall=1.0, first_step=4, input_wait=None):
  """Status reports, one per value of the worker's own seconds (and of its
  input wait, if given)."""
  input_wait = input_wait or [0.01] * len(own_seconds)
  return [{'step': first_step + 4 * index,
           'seconds': {'training': wall, 'training_cpu': own / 2,
                       'stalled': own / 2, 'input_wait': waited}}
          for index, (own, waited) in enumerate(zip(own_seconds, input_wait))]


def test_a_straggler_is_named_after_the_window_and_again_when_it_recovers():
  check = stragglers.StragglerCheck(factor=1.5, reports=3)

  def lines(worker0, worker1):
    return check.update({
        0: {**_status(0), 'reports': _reports(worker0)},
        1: {**_status(1), 'reports': _reports(worker1)}})

  assert lines([0.2, 0.2], [0.2, 0.9]) == []  # Two reports: no window yet.
  assert lines([0.2] * 3, [0.25, 0.2, 0.3]) == []  # Even.
  assert lines([0.2] * 3, [0.2, 2.0, 0.2]) == []  # One stall.
  # Slow in each report of the window, by more than a fifth of the loops'
  # wall time.
  [named] = lines([0.2] * 4, [0.2, 0.9, 0.9, 0.9])
  assert named.startswith('Straggler: worker 1 (h, pid 101) is '
                          'compute-bound'), named
  assert lines([0.2] * 5, [0.2, 0.9, 0.9, 0.9, 0.9]) == []  # Said once.
  assert lines([0.2] * 3, [0.9, 0.2, 0.2]) == []  # Not slow in all: yet.
  # Above the factor, but by less than a fifth of the wall time: even.
  assert check.update({
      0: {**_status(0), 'reports': _reports([0.01] * 3, wall=3.0)},
      1: {**_status(1), 'reports': _reports([0.1] * 3, wall=3.0)},
  }) == ['Worker 1 (h, pid 101) is no longer a straggler: 0.30 s of CPU '
         'and stalls in its loops over the last 3 reports, against 0.03 s '
         'for the others.']
  # Only reports every worker wrote count.
  assert check.update({
      0: {**_status(0), 'reports': _reports([0.2] * 3)},
      1: {**_status(1), 'reports': _reports([0.9] * 3, first_step=8)}}) == []


def test_a_straggler_waiting_for_its_input_is_named_input_bound():
  check = stragglers.StragglerCheck(factor=1.5, reports=3)

  def lines(input0, input1, own1=(0.2,) * 3):
    return check.update({
        0: {**_status(0), 'reports': _reports([0.2] * 3, input_wait=input0)},
        1: {**_status(1), 'reports': _reports(list(own1),
                                              input_wait=input1)}})

  [named] = lines([0.01] * 3, [0.6] * 3)
  assert named == ('Straggler: worker 1 (h, pid 101) is input-bound (its '
                   'steps wait for its input pipeline): 1.80 s waiting for '
                   'input in its steps over the last 3 reports, against '
                   '0.03 s for the others. Every worker waits for it at each '
                   'all-reduce.')
  assert check.stragglers == {1: 'input'}
  assert lines([0.01] * 3, [0.6, 0.01, 0.6]) == []  # Slow in one: not yet.
  assert lines([0.01] * 3, [0.01] * 3) == [
      'Worker 1 (h, pid 101) is no longer a straggler: 0.03 s waiting for '
      'input in its steps over the last 3 reports, against 0.03 s for the '
      'others.']
  # Stopped half the time: some stops fall in its input reads, most in its
  # work. Compute-bound.
  [named] = lines([0.01] * 3, [0.3] * 3, own1=(0.9,) * 3)
  assert ' is compute-bound (' in named, named
  assert check.stragglers == {1: 'work'}


def test_each_workers_timings_are_written_once_per_report_all_wrote():
  timings = worker_timings.WorkerTimings('unused', 2, None)

  def worker(index, steps, started=900.0, at=950.0):
    return {**_status(index), 'started': started, 'reports': [
        {'step': step, 'time': at + step, 'seconds': {
            'training': 0.5, 'training_cpu': 0.2, 'stalled': 0.1,
            'input_wait': 0.05 * index, 'checkpoint': 0.25, 'ctl.report': 0.001,
            'worker-status': 0.002}} for step in steps]}

  assert timings.update({0: worker(0, [4, 8]), 1: worker(1, [4])}) == {
      4: {'workers/0/actions_ms': 3.0, 'workers/0/checkpoint_ms': 250.0,
          'workers/0/input_wait_ms': 0.0, 'workers/0/loops_ms': 500.0,
          'workers/0/work_ms': 300.0,
          'workers/1/actions_ms': 3.0, 'workers/1/checkpoint_ms': 250.0,
          'workers/1/input_wait_ms': 50.0, 'workers/1/loops_ms': 500.0,
          'workers/1/work_ms': 300.0}}
  # Step 4 once; step 8 once every worker wrote it.
  assert list(timings.update({0: worker(0, [4, 8, 12]),
                              1: worker(1, [4, 8])})) == [8]
  # A peer's file of an earlier run (reports before the chief started).
  assert timings.update({0: worker(0, [16], started=1000.0, at=1000.0),
                         1: worker(1, [16])}) == {}
  assert list(timings.update({0: worker(0, [16], started=1000.0, at=1000.0),
                              1: worker(1, [16], at=1000.0)})) == [16]
