"""Seeing into a job: a hung worker named, SIGUSR1 dumps, `ctl.status`.

Real workers and real signals: of 3 workers, one whose input is slow is
named input-bound; each dumps on SIGUSR1 and trains on, then worker 1 is
stopped for good (SIGSTOP): the others name it alone, in their dumps and
their error lines; a worker stopped half the time is named as the
straggler whatever the report interval; ctl.status reads the workdir
throughout. A job of one worker dumps on SIGUSR1 too, with no watchdog or
status thread.
"""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

from ctl import errors
from ctl.cluster import diagnostics
from ctl.cluster import peer_evidence
from ctl.cluster import stragglers
from ctl.cluster import watchdog
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


def named_in(text: str) -> list[int]:
  """The workers a dump or an error line names as stopped."""
  [named] = re.findall(r'Stopped making progress: (.*)', text)
  return [int(index) for index in re.findall(r'(?:^|; )worker (\d+)\b',
                                             named)]


def wait_for_dump(workdir, worker: helpers.Watched, index: int,
                  text: str) -> str:
  """The worker's dump, once one holding `text` is written."""
  path = workdir / 'diagnostics' / f'worker-{index}-{worker.process.pid}.txt'
  deadline = time.monotonic() + 120
  while text not in (dump := path.read_text() if path.exists() else ''):
    assert worker.process.poll() is None, worker.output[-3000:]
    assert time.monotonic() < deadline, f'no {text!r} in {path}'
    time.sleep(0.02)
  return dump


@pytest.mark.slow
def test_one_worker_dumps_on_sigusr1_with_no_watchdog_or_status_thread(
    tmp_path):
  # A job of one worker waits on no peer: no watchdog and no status
  # writer thread (issue 49); SIGUSR1 still dumps its stacks and status,
  # and training goes on, its status file rewritten by its training thread.
  worker = helpers.Watched(helpers.ctl_command(
      f'--config={helpers.DIGITS}', '--config.num_epochs=1000',
      '--config.intervals.log_steps=4', '--config.steps_per_loop=4',
      f'--workdir={tmp_path}'))
  try:
    wait_for_step(worker, 8)
    worker.process.send_signal(signal.SIGUSR1)
    dump = wait_for_dump(tmp_path, worker, 0, 'SIGUSR1 asked')
    threads = re.findall(r'--- Thread (\S+)', dump)
    assert 'MainThread' in threads, dump
    assert not {'ctl-watchdog', 'ctl-worker-status',
                'ctl-stall-meter'} & set(threads), threads
    assert re.search(r'This worker: worker 0 \(\S+, pid \d+\): running, '
                     r'phase \S+, step \d+', dump), dump
    assert named_in(dump) == [], dump
    step = int(re.search(r'This worker: .* step (\d+)', dump).group(1))
    wait_for_step(worker, step + 8)
    path = tmp_path / 'workers' / 'worker-0.json'
    deadline = time.monotonic() + 120  # Written at most once a second.
    while (status := json.loads(path.read_text()))['step'] <= step:
      assert time.monotonic() < deadline, status
      time.sleep(0.05)
    assert status['state'] == 'running', status
    assert status['heartbeat_seconds'] is None, status
  finally:
    worker.kill()


@pytest.mark.slow
def test_of_three_workers_the_slow_one_and_then_the_stopped_one_are_named(
    tmp_path):
  # One job of 3 workers, worker 1 waiting 50 ms for each batch from the
  # first step: it alone is named input-bound (its steps do little else,
  # so only its input wait tells it from the others). Then each worker
  # dumps on SIGUSR1 and trains on, naming no one as stopped; then worker
  # 1 is stopped for good (SIGSTOP): workers 0 and 2 name it, and only it,
  # in their dumps and their error lines. ctl.status reads the workdir
  # throughout.
  # Long enough for a first step on a busy machine (the preemption tests
  # run with 15 s): the stop ends the job through TensorFlow's heartbeat or
  # the watchdog, whichever comes first.
  timeout = 30
  workers = [helpers.Watched(helpers.ctl_command(
      f'--config={NOISY}:SlowInputOnOneWorker', '--config.batch_size=48',
      '--config.num_epochs=1000', '--config.steps_per_loop=4',
      '--config.intervals.log_steps=4', '--config.intervals.checkpoint_steps=0',
      '--config.log_csv=True',
      f'--config.distribution.timeout_seconds={timeout}',
      f'--workdir={tmp_path}'), env)
             for env in helpers.cluster_envs(3, CTL_SLOW_INPUT_WORKER='1')]
  try:
    _slow_input_is_named(workers, tmp_path)
    for worker in workers:
      worker.wait_for(r'step 8/', timeout=300)
    running = ctl_status(tmp_path)
    assert running.returncode == 0, running.stderr[-3000:]
    assert ': RUNNING: training' in running.stdout
    assert 'workers (3):' in running.stdout
    _sigusr1_dumps_name_no_one(workers, tmp_path)
    _the_stopped_one_alone_is_named(workers, tmp_path, timeout)
    failed = ctl_status(tmp_path)
    assert failed.returncode == 0, failed.stderr[-3000:]
    assert re.search(r': FAILED: worker [02] exited with code 43',
                     failed.stdout), failed.stdout
  finally:
    for worker in workers:
      worker.kill()


def _slow_input_is_named(workers: list[helpers.Watched], workdir) -> None:
  """The chief, ctl.status and each worker's timings name worker 1
  input-bound, and no one else a straggler."""
  chief = workers[0]
  named = chief.wait_for(r'Straggler: worker (\d+) \(\S+, pid (\d+)\) is '
                         r'(\S+) \(.*: ([\d.]+) s waiting for input',
                         timeout=300)
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
                      (status := ctl_status(workdir)).stdout):
    assert time.monotonic() < deadline, status.stdout
  # Each worker's timings: in TensorBoard, and in metrics.csv with a later
  # report, under the steps of their reports.
  deadline = time.monotonic() + 120
  while 'workers/1/input_wait_ms' not in (
      (workdir / 'metrics.csv').read_text()
      if (workdir / 'metrics.csv').exists() else ''):
    assert chief.process.poll() is None, chief.output[-3000:]
    assert time.monotonic() < deadline, 'no worker timings in metrics.csv'
    time.sleep(0.05)
  rows = _csv_values(workdir / 'metrics.csv')
  scalars = helpers.read_scalars(workdir / 'workers')
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


def _sigusr1_dumps_name_no_one(workers: list[helpers.Watched],
                               workdir) -> None:
  """SIGUSR1: a dump each, naming no one as stopped, and training goes on."""
  for worker in workers:
    worker.process.send_signal(signal.SIGUSR1)
  for index, worker in enumerate(workers):
    dump = wait_for_dump(workdir, worker, index, 'SIGUSR1 asked')
    assert '--- Thread MainThread' in dump
    assert re.search(r'  worker 2 \(\S+, pid \d+\): running', dump)
    assert named_in(dump) == [], dump
    assert 'Stopped making progress: none (' in dump
    (workdir / 'diagnostics' /
     f'worker-{index}-{worker.process.pid}.txt').unlink()
  step = int(re.search(r'This worker: .* step (\d+)', dump).group(1))
  wait_for_step(workers[1], step + 8)


def _the_stopped_one_alone_is_named(workers: list[helpers.Watched], workdir,
                                    timeout: int) -> None:
  """Worker 1 stopped for good: once this machine sees it stopped, the
  others' SIGUSR1 dumps, error lines and failure dumps name it alone."""
  victim = workers[1].process
  victim.send_signal(signal.SIGSTOP)
  while pathlib.Path(f'/proc/{victim.pid}/stat').read_text().rsplit(
      ')', 1)[1].split()[0] != 'T':
    time.sleep(0.01)
  for index in (0, 2):
    workers[index].process.send_signal(signal.SIGUSR1)
  for index in (0, 2):
    dump = wait_for_dump(workdir, workers[index], index, 'SIGUSR1 asked')
    assert named_in(dump) == [1], dump
    assert re.search(rf'Stopped making progress: worker 1 \(\S+, pid '
                     rf'{victim.pid}\): running.*its process is stopped',
                     dump), dump

  for index in (0, 2):
    assert workers[index].wait(timeout=timeout + 120) == (
        errors.EXIT_PEER_FAILED)
    [line] = [line for line in workers[index].output.splitlines()
              if line.startswith('ctl: error:')]
    assert named_in(line) == [1], line
    assert re.search(r'Stopped making progress: worker 1 \(\S+, pid '
                     rf'{victim.pid}\): running, phase [^,]+, step \d+.*'
                     ': its process is stopped', line), line
    dump = workdir / 'diagnostics' / (
        f'worker-{index}-{workers[index].process.pid}.txt')
    assert str(dump) in line
    stacks = dump.read_text()
    assert named_in(stacks) == [1], stacks
    # Whichever ended the wait (TensorFlow or the watchdog), the dump
    # shows where the main thread waited: in the loop (the watchdog's, in
    # its stack; TensorFlow's, in its error's traceback), in its steps or
    # an evaluation. (The watchdog's header, as ctl/cluster/watchdog.py
    # words it since b321012.)
    assert re.search(
        rf'(No progress for {timeout} s \(config\.distribution\.'
        r'timeout_seconds\)|TensorFlow reported a lost peer)', stacks), stacks
    assert 'ctl/training/loop.py' in stacks, stacks


@pytest.mark.slow
def test_a_worker_at_half_speed_is_named_though_no_report_is_slow_in_a_row(
    tmp_path):
  # Worker 1 stopped 0.5 s and running 0.5 s, again and again, with a report
  # every 11 steps (0.3-0.6 s): each report sees it slow or not by turns.
  log_steps = 11
  workers = [helpers.Watched(helpers.ctl_command(
      *ARGS[:-3], '--config.steps_per_loop=11',
      f'--config.intervals.log_steps={log_steps}',
      '--config.intervals.summary_steps=0',
      '--config.distribution.timeout_seconds=120',
      f'--workdir={tmp_path}'), env) for env in helpers.cluster_envs(2)]
  chief, victim = workers[0], workers[1].process
  slowed = threading.Event()

  def stop_half_the_time():
    while slowed.is_set():
      victim.send_signal(signal.SIGSTOP)
      time.sleep(0.5)
      victim.send_signal(signal.SIGCONT)
      time.sleep(0.5)

  try:
    wait_for_step(chief, 132, timeout=300)
    assert 'Straggler' not in chief.output
    reports_before = len(re.findall(r' step \d+/', chief.output))
    slowed.set()
    slowed_at = time.monotonic()
    duty = threading.Thread(target=stop_half_the_time, daemon=True)
    duty.start()
    named = chief.wait_for(r'Straggler: worker (\d+) \(\S+, pid (\d+)\) is '
                           r'compute-bound')
    assert named.groups() == ('1', str(victim.pid))
    reports = len(re.findall(r' step \d+/', chief.output)) - reports_before
    # Printed, not asserted (a loaded machine is slower): issue 47's aim is
    # within 10 s of the slowdown, whatever intervals.log_steps is.
    print(f'named {time.monotonic() - slowed_at:.1f} s after the slowdown '
          f'began, after {reports} reports: ' + next(
        line for line in chief.output.splitlines() if 'Straggler:' in line))
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


def test_a_peer_is_named_only_on_evidence_in_its_own_file():
  now = 1000.0
  me = _status(0, progress_age=20.0)

  def named(peer):
    return peer_evidence.stalled_peers({0: me, 1: peer, 2: _status(2)}, 0,
                                       now)

  assert named(_status(1, age=12.0))[0].endswith(
      'its status stopped changing (stopped, dead or unreachable)')
  assert named(None) == ['worker 1: wrote no status (it never started '
                         'training)']
  assert named({**_status(1, state='failed'), 'exit_code': 1,
                'reason': 'NaN'})[0].endswith('it ended: NaN')
  # Stuck in an action: another phase for two heartbeats when it wrote.
  [stuck] = named({**_status(1, phase='evaluate'), 'phase_time': now - 12})
  assert stuck.endswith("in phase evaluate for 11 s when it last wrote, not "
                        "in this worker's (training)"), stuck
  # No evidence: a healthy file's step and phase lag its loop (a write is
  # at most once a second, a phase's start at the next heartbeat), and a
  # peer that lost its peers too (exit code 43) is a bystander.
  assert named(_status(1, step=36)) == []
  assert named({**_status(1, phase='worker-status'),
                'phase_time': now - 3}) == []
  assert named({**_status(1, state='failed'), 'exit_code': 43,
                'reason': 'Lost the other workers'}) == []
  assert named(_status(1)) == []


def test_a_file_an_earlier_runs_worker_left_is_not_this_runs_peer():
  # A job resumed after its worker 1 was killed: worker 1's file is the old
  # run's (its pid gone), this run's worker 1 has not written yet.
  old = subprocess.Popen([sys.executable, '-c', 'pass'])
  old.wait()
  now = time.time()
  left = {**_status(1, now=now - 300), 'host': socket.gethostname(),
          'pid': old.pid, 'started': now - 400}
  me = {**_status(0, now=now), 'started': now - 20}
  assert peer_evidence.stalled_peers({0: me, 1: left}, 0, now) == [
      'worker 1: wrote no status since this worker started (it never started '
      'training in this run)']
  # Written since this worker started: the same file is evidence.
  assert peer_evidence.stalled_peers(
      {0: me, 1: {**left, 'time': now - 10}}, 0, now)[0].endswith(
          ': its process is gone')


def test_the_dump_shows_the_wait_whichever_of_tensorflow_and_watchdog_ended_it(
    tmp_path):
  # TensorFlow's own report of a lost peer (a peer that its own watchdog
  # ended) can come just before this worker's watchdog fires, which then
  # dumps while this worker is on its way out (its stacks not the wait: seen
  # in CI). The dump named is then one with TensorFlow's error, whose
  # traceback shows the wait. Where this watchdog's abort ended the wait,
  # its dump (taken at the wait) is kept.
  me = worker_status.WorkerStatus(str(tmp_path), worker_index=0,
                                  num_workers=2, timeout_seconds=30)
  watchdog_why = 'No progress for 30 s: aborting the collectives'

  def waited_in_a_collective(message: str) -> Exception:
    try:
      raise tf.errors.DeadlineExceededError(None, None, message)
    except tf.errors.DeadlineExceededError as error:
      return error

  lost = waited_in_a_collective('Collective ops is aborted by: a peer lost')
  dump = diagnostics.write(me, watchdog_why)
  failure = diagnostics.name_stalled_peers(errors.PeerFailure('Lost.'), me,
                                           lost, dump)
  text = pathlib.Path(dump).read_text()
  assert 'TensorFlow reported a lost peer (DeadlineExceededError)' in text
  assert 'in waited_in_a_collective' in text and watchdog_why not in text
  assert f'Stacks and every worker\'s last status: {dump}.' in str(failure)

  aborted = waited_in_a_collective(f'{watchdog.ABORT_MESSAGE}30')
  dump = diagnostics.write(me, watchdog_why)
  failure = diagnostics.name_stalled_peers(errors.PeerFailure('Lost.'), me,
                                           aborted, dump)
  text = pathlib.Path(dump).read_text()
  assert watchdog_why in text and 'TensorFlow reported' not in text
  assert dump in str(failure)


def test_a_peer_on_this_machine_is_named_when_its_process_is_stopped_or_gone():
  peer = subprocess.Popen([sys.executable, '-c', 'import time; '
                           'time.sleep(600)'])
  try:
    now = time.time()
    status = {**_status(1, now=now), 'host': socket.gethostname(),
              'pid': peer.pid, 'started': now}

    def named():
      return peer_evidence.stalled_peers({0: _status(0, now=now), 1: status},
                                         0, now)

    assert named() == []
    peer.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 60
    while not named():
      assert time.monotonic() < deadline, 'never seen stopped'
      time.sleep(0.01)
    assert named()[0].endswith('its process is stopped (SIGSTOP, or a '
                               'debugger)'), named()
    peer.kill()
    peer.wait()
    assert named()[0].endswith(': its process is gone'), named()
    # A running process of that pid, started before the worker's status;
    # and one started after it: its pid is another's now.
    status['pid'] = os.getpid()
    assert named() == []
    status['started'] = now - 10**6
    assert named()[0].endswith(': its process is gone'), named()
  finally:
    peer.kill()


def _samples(work_per_step, *, input_per_step=None, steps=4, seconds=0.5,
             at=1000.0):
  """A worker's samples of its running totals, one per value of its work
  per step (and of its input wait per step), `seconds` apart."""
  input_per_step = input_per_step or [0.001] * len(work_per_step)
  samples, totals = [[0, at, 0.0, 0.0, 0.0, 0.0]], [0.0, 0.0]
  for index, (work, waited) in enumerate(zip(work_per_step, input_per_step)):
    totals = [totals[0] + work * steps, totals[1] + waited * steps]
    samples.append([steps * (index + 1), at + seconds * (index + 1),
                    seconds * (index + 1), totals[0] / 2, totals[0] / 2,
                    totals[1]])
  return samples


def _statuses(*workers):
  """Every worker's status holding its samples."""
  return {index: {**_status(index), 'started': 900.0, 'samples': samples}
          for index, samples in enumerate(workers)}


def test_a_straggler_is_named_over_time_whatever_the_report_interval():
  check = stragglers.StragglerCheck(factor=1.5, seconds=4.0)
  even, half_speed = [0.02] * 8, [0.02, 0.1] * 4

  def update(*work_per_step):
    return check.update(_statuses(*map(_samples, work_per_step)))

  # Not 4 s of samples yet: no verdict.
  assert update(even[:6], half_speed[:6], even[:6]) == []
  assert update(even, even, even) == []
  # Stopped in every other sample (more often than any report count could
  # see it slow in a row): slow in both halves of its last 4 s.
  [named] = update(even, half_speed, even)
  assert named == ('Straggler: worker 1 (h, pid 101) is compute-bound (its '
                   'own work in the steps: CPU time, and time it was kept '
                   'from running): 1.92 s of CPU and stalls in its loops over '
                   'its last 4.0 s (32 steps), against 0.64 s for the '
                   'others. Every worker waits for it at each all-reduce.')
  assert update(even, half_speed, even) == []  # Said once.
  # One stall of a busy machine falls in one half: no change either way.
  one_stall = [0.02] * 7 + [0.3]
  assert update(even, one_stall, even) == []
  assert update(even, even, even) == [
      'Worker 1 (h, pid 101) is no longer a straggler: 0.64 s of CPU and '
      'stalls in its loops over its last 4.0 s (32 steps), against 0.64 s '
      'for the others.']
  assert update(even, one_stall, even) == []
  # Above the factor, but by less than a fifth of the time: even.
  assert update(even, [0.04] * 8, even) == []
  # A peer's file of an earlier run: no verdict.
  earlier = _statuses(*map(_samples, (even, half_speed, even)))
  earlier[1]['samples'] = _samples(half_speed, at=800.0)
  assert check.update(earlier) == []


def test_a_straggler_waiting_for_its_input_is_named_input_bound():
  check = stragglers.StragglerCheck(factor=1.5, seconds=4.0)
  even = [0.02] * 8

  def lines(input1, work1=even):
    return check.update(_statuses(
        _samples(even), _samples(work1, input_per_step=input1),
        _samples(even)))

  [named] = lines([0.06] * 8)
  assert named == ('Straggler: worker 1 (h, pid 101) is input-bound (its '
                   'steps wait for its input pipeline): 1.92 s waiting for '
                   'input in its steps over its last 4.0 s (32 steps), '
                   'against 0.03 s for the others. Every worker waits for it '
                   'at each all-reduce.')
  assert check.stragglers == {1: 'input'}
  assert lines([0.001] * 8) == [
      'Worker 1 (h, pid 101) is no longer a straggler: 0.03 s waiting for '
      'input in its steps over its last 4.0 s (32 steps), against 0.03 s '
      'for the others.']
  # Stopped half the time: some stops fall in its input reads, most in its
  # work. Compute-bound.
  [named] = lines([0.03] * 8, work1=[0.1] * 8)
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
