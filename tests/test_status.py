"""`python -m ctl.status`: instant (no TensorFlow), true by the evidence,
and one readable line for each damaged input.

Real workdirs: one trained digits run shared by the module, copied and
damaged by hand; a run SIGKILLed; a 2-worker job with a worker stopped
(SIGSTOP), then killed.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from ctl import errors
import helpers

ARGS = (f'--config={helpers.DIGITS}', '--config.intervals.log_steps=4',
        '--config.steps_per_loop=4')


def ctl_status(workdir) -> subprocess.CompletedProcess:
  """`python -m ctl.status workdir`, with its import times on stderr."""
  return subprocess.run(
      [sys.executable, '-X', 'importtime', '-m', 'ctl.status',
       os.fsencode(workdir)], cwd=helpers.REPO, env=helpers.env_with(),
      capture_output=True, text=True, errors='backslashreplace', timeout=120)


def answer(workdir, code: int = 0) -> str:
  """ctl.status's output (stdout, or its error line), checked to be no
  traceback, with exit code `code`, and without TensorFlow imported."""
  shown = ctl_status(workdir)
  stderr = '\n'.join(line for line in shown.stderr.splitlines()
                     if not line.startswith('import time:'))
  assert 'Traceback' not in shown.stderr, stderr
  assert shown.returncode == code, (shown.stdout, stderr)
  imported = re.findall(r'import time: .*\| +(\S+)$', shown.stderr, re.M)
  assert 'ctl.status.view' in imported
  assert not [name for name in imported
              if name.split('.')[0] in ('tensorflow', 'keras')]
  return shown.stdout if code == 0 else stderr


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
  """A finished digits run's workdir (2 epochs, 88 steps)."""
  workdir = tmp_path_factory.mktemp('finished')
  run = helpers.run_ctl(*ARGS, '--config.num_epochs=2', f'--workdir={workdir}')
  assert run.returncode == 0, run.stderr[-3000:]
  return workdir


def copy_of(workdir, tmp_path):
  """A copy of workdir to damage."""
  copy = tmp_path / 'copy'
  shutil.copytree(workdir, copy, symlinks=True)
  return copy


def test_a_finished_run_without_tensorflow(finished):
  shown = answer(finished)
  assert f'{finished}: FINISHED: training finished (exit code 0)' in shown
  assert 'step 88 of 88, epoch 2 of 2' in shown
  assert 'last checkpoint: step 88, ' in shown
  assert re.search(r'best accuracy: [\d.]+ at step 88', shown)
  assert re.search(r'worker 0 \S+ pid \d+: finished, finished, step 88',
                   shown)
  assert 'unreadable' not in shown
  # One worker: written by its training thread, without a heartbeat.
  assert _worker_file(finished)['heartbeat_seconds'] is None
  # And in this process: render() imports no TensorFlow either.
  check = subprocess.run(
      [sys.executable, '-c', 'import sys; from ctl import status; '
       f'status.render({str(finished)!r}); '
       'print(sorted(name for name in sys.modules if name.split(".")[0] in '
       '("tensorflow", "keras")))'],
      cwd=helpers.REPO, env=helpers.env_with(), capture_output=True,
      text=True, timeout=120)
  assert check.stdout.strip() == '[]', check.stderr[-3000:]


def _worker_file(workdir) -> dict:
  return json.loads((workdir / 'workers' / 'worker-0.json').read_text())


def _put(path, content) -> None:
  """Writes content (bytes, text, or JSON of anything else) at path."""
  if isinstance(content, bytes):
    path.write_bytes(content)
  elif isinstance(content, str):
    path.write_text(content)
  else:
    path.write_text(json.dumps(content))


# (name, file, what to put there (a function of the worker's file: its
# JSON), the unreadable line's pattern)
DAMAGES = [
    ('worker file a list', 'workers/worker-0.json', lambda _: [1, 2],
     'a JSON list, not an object'),
    ('worker file of another shape', 'workers/worker-0.json',
     lambda _: {'worker': 0, 'loss': 1.0}, 'it has no "num_workers"'),
    ('worker pid a string', 'workers/worker-0.json',
     lambda status: {**status, 'pid': 'x'}, 'its "pid" is \'x\''),
    ('worker state unknown', 'workers/worker-0.json',
     lambda status: {**status, 'state': 'dancing'}, '"state"'),
    ('worker time infinite', 'workers/worker-0.json',
     lambda status: '{"time": Infinity, ' + json.dumps(
         {k: v for k, v in status.items() if k != 'time'})[1:],
     'its "time" is inf'),
    ('worker reports not reports', 'workers/worker-0.json',
     lambda status: {**status, 'reports': [{'step': 'x'}]}, 'a report:'),
    ('worker file of another worker', 'workers/worker-0.json',
     lambda status: {**status, 'worker': 3}, '"worker" is 3'),
    ('worker file not UTF-8', 'workers/worker-0.json', lambda _: b'{\xff}',
     'UnicodeDecodeError'),
    ('worker file cut short', 'workers/worker-0.json',
     lambda status: json.dumps(status)[:40], 'JSONDecodeError'),
    ('results garbage', 'results.json', lambda _: 'steps: many',
     'JSONDecodeError'),
    ('results of another shape', 'results.json', lambda _: {'step': -1},
     '"step" is -1'),
    ('checkpoint state garbage', 'checkpoints/checkpoint',
     lambda _: 'ckpt ckpt ckpt', 'not a checkpoint state file'),
    ('checkpoint state binary', 'checkpoints/checkpoint',
     lambda _: bytes(range(256)), 'UnicodeDecodeError'),
    ('best record garbage', 'best/best.json', lambda _: {'value': 'high'},
     'it has no "metric"'),
    ('config garbage', 'config.json', lambda _: '{', 'JSONDecodeError'),
]


@pytest.mark.parametrize('name,relative,content,why', DAMAGES,
                         ids=[damage[0] for damage in DAMAGES])
def test_each_damaged_file_is_one_line(finished, tmp_path, name, relative,
                                       content, why):
  del name
  workdir = copy_of(finished, tmp_path)
  _put(workdir / relative, content(_worker_file(workdir)))
  shown = answer(workdir)
  [line] = [line for line in shown.splitlines() if 'unreadable:' in line]
  assert str(workdir / relative) in line and why in line, line
  first = shown.splitlines()[0]
  if relative.startswith('workers/'):  # results.json tells the end.
    assert first == (f'{workdir}: FINISHED: training finished '
                     '(results.json)'), shown
  else:
    assert 'FINISHED: training finished (exit code 0)' in first, shown


def test_folders_and_files_gone_or_misplaced(finished, tmp_path):
  workdir = copy_of(finished, tmp_path)
  # A diagnostics file gone between the listing and its read (a link to
  # nothing: listed, then not found), and one that is there.
  (workdir / 'diagnostics').mkdir()
  (workdir / 'diagnostics' / 'worker-0-1.txt').symlink_to(tmp_path / 'gone')
  (workdir / 'diagnostics' / 'worker-0-2.txt').write_text('stacks')
  (workdir / 'checkpoints' / 'ckpt-88.index').unlink()
  shown = answer(workdir)
  assert re.search(r'latest diagnostics: \S+worker-0-2.txt \(written '
                   r'[\d:]+ ago; 1 in all\)', shown), shown
  # ckpt-88's files are gone: a resume starts from ckpt-44.
  assert 'last checkpoint: step 44, ' in shown
  # A folder where results.json would be, and no status files.
  shutil.rmtree(workdir / 'workers')
  os.remove(workdir / 'results.json')
  os.mkdir(workdir / 'results.json')
  shown = answer(workdir)
  assert re.search(r'UNKNOWN: \S+results.json cannot be read: '
                   r'IsADirectoryError', shown.splitlines()[0]), shown


def _running(workdir, **fields) -> None:
  """Makes worker-0.json say it runs now, as this process, with fields."""
  now = time.time()
  status = {**_worker_file(workdir), 'state': 'running', 'phase': 'training',
            'exit_code': None, 'host': socket.gethostname(),
            'pid': os.getpid(), 'started': now, 'time': now,
            'progress_time': now}
  _put(workdir / 'workers' / 'worker-0.json', {**status, **fields})


def test_each_worker_judged_by_the_evidence(finished, tmp_path):
  workdir = copy_of(finished, tmp_path)
  os.remove(workdir / 'results.json')
  # A checkpoint saved after the worker last wrote its status: the step
  # shown is the checkpoint's, not one before it.
  for suffix in ('index', 'data-00000-of-00001'):
    os.remove(workdir / 'checkpoints' / f'ckpt-88.{suffix}')
  _running(workdir, step=40)
  shown = answer(workdir)
  assert f'{workdir}: RUNNING: training' in shown
  assert 'step 44 of 88, ' in shown and 'last checkpoint: step 44' in shown
  # Its process ended without writing how (a pid that no longer exists).
  gone = subprocess.Popen(['true'])
  gone.wait()
  _running(workdir, step=40, pid=gone.pid)
  shown = answer(workdir)
  assert (f'{workdir}: FAILED: worker 0 ({socket.gethostname()}, pid '
          f'{gone.pid}) is gone: its process no longer exists') in shown
  assert re.search(rf'worker 0 \S+ pid {gone.pid}: gone, ', shown), shown
  # A pid now another process's (this one, which began after `started`).
  _running(workdir, started=time.time() - 10**6)
  assert ': FAILED: worker 0 ' in answer(workdir)
  # A reason of lone surrogates (valid JSON) is shown, not raised on.
  _running(workdir, state='failed', exit_code=1, reason='\ud800')
  assert ('FAILED: worker 0 exited with code 1: \\ud800'
          in answer(workdir))
  # On another host: silent for 3 heartbeats; fresh but without progress.
  _running(workdir, host='elsewhere', time=time.time() - 100,
           heartbeat_seconds=10)
  assert re.search(r'HUNG: worker 0 \(elsewhere, pid \d+\) is silent: its '
                   r'status stopped changing 0:01:4\d ago', answer(workdir))
  _running(workdir, host='elsewhere', timeout_seconds=60,
           progress_time=time.time() - 100)
  assert re.search(r'HUNG: worker 0 \(elsewhere, pid \d+\) is stalled: '
                   r'it made no progress for 0:01:4\d, over its timeout of 60',
                   answer(workdir))
  # One worker's file, written by its training thread, has no heartbeat:
  # a file 100 s old is its progress, judged by its timeout alone.
  _running(workdir, host='elsewhere', heartbeat_seconds=None,
           timeout_seconds=600, time=time.time() - 100,
           progress_time=time.time() - 100)
  assert f'{workdir}: RUNNING: training' in answer(workdir)
  _running(workdir, host='elsewhere', heartbeat_seconds=None,
           timeout_seconds=60, time=time.time() - 100,
           progress_time=time.time() - 100)
  assert re.search(r'HUNG: worker 0 \(elsewhere, pid \d+\) is stalled: ',
                   answer(workdir))


PS_JOB = {'chief': 1, 'worker': 2, 'ps': 1}


def test_a_parameter_server_job_is_its_chiefs_file(finished, tmp_path):
  # Its workers and servers write no status file: the chief's (the loop's
  # one worker) says what the job is, and their silence is no hang.
  workdir = copy_of(finished, tmp_path)
  _put(workdir / 'workers' / 'worker-0.json',
       {**_worker_file(workdir), 'job': PS_JOB})
  shown = answer(workdir)
  assert f'{workdir}: FINISHED: training finished (exit code 0)' in shown
  assert ('  parameter-server job: the chief coordinates 2 worker(s) and 1 '
          'parameter server(s), which write no status file' in shown), shown
  assert re.search(r'\n    the chief \S+ pid \d+: finished, finished, '
                   r'step 88', shown), shown
  assert 'workers (' not in shown and 'worker 0' not in shown
  os.remove(workdir / 'results.json')
  _running(workdir, step=40, job=PS_JOB)
  shown = answer(workdir)
  assert f'{workdir}: RUNNING: training' in shown, shown
  assert 'step 88 of 88, ' in shown  # Its latest checkpoint's step.
  gone = subprocess.Popen(['true'])
  gone.wait()
  _running(workdir, step=40, pid=gone.pid, job=PS_JOB)
  assert (f'{workdir}: FAILED: the chief ({socket.gethostname()}, pid '
          f'{gone.pid}) is gone: its process no longer exists'
          in answer(workdir))
  _put(workdir / 'workers' / 'worker-0.json',
       {**_worker_file(workdir), 'job': {'ps': 'one'}})
  assert re.search(r'\S+worker-0.json is not what ctl writes there: its '
                   r'"job" is', answer(workdir))

def test_not_a_workdir(tmp_path):
  other = tmp_path / 'other tool'
  other.mkdir()
  (other / 'config.json').write_text('{"model": "gpt", "lr": 0.1}')
  line = answer(other, errors.EXIT_USAGE)
  assert line == (f'ctl: error: {other} is not a ctl workdir: it has no '
                  'workers/worker-<i>.json, results.json, '
                  'checkpoints/checkpoint or config.json of a ctl run. Pass '
                  'the --workdir of a training run.')
  # A path that is not UTF-8, shown with its escape.
  line = answer(os.fsdecode(bytes(tmp_path) + b'/x\xff'), errors.EXIT_USAGE)
  assert line.startswith(f'ctl: error: {tmp_path}/x\\xff is not a ctl '
                         'workdir: no such folder, so no '), line


def _status_until(workdir, pattern: str, timeout: float = 180) -> str:
  """ctl.status's output once a line matches pattern (it is rerun)."""
  deadline = time.monotonic() + timeout
  while not re.search(pattern, shown := answer(workdir)):
    assert time.monotonic() < deadline, shown
    time.sleep(0.2)
  return shown


@pytest.mark.slow
def test_a_stopped_then_killed_worker_of_a_two_worker_job(tmp_path):
  # A long timeout: only the evidence of the stopped process says HUNG.
  workers = [helpers.Watched(helpers.ctl_command(
      *ARGS, '--config.num_epochs=1000',
      '--config.distribution.timeout_seconds=300', f'--workdir={tmp_path}'),
                             env) for env in helpers.cluster_envs(2)]
  victim = workers[1].process
  try:
    helpers.wait_for_glob(tmp_path, 'config.json', workers[0].process)
    shown = _status_until(
        tmp_path, r'last checkpoint: step \d+(.|\n)*worker 1 \S+ pid \d+: '
        r'running, training')
    assert f'{tmp_path}: RUNNING: training' in shown
    # The step shown is never before the checkpoint shown.
    step = int(re.search(r'  step (\d+) of', shown).group(1))
    assert step >= int(re.search(r'last checkpoint: step (\d+)',
                                 shown).group(1)), shown

    victim.send_signal(signal.SIGSTOP)
    shown = answer(tmp_path)
    assert (f'{tmp_path}: HUNG: worker 1 ({socket.gethostname()}, pid '
            f'{victim.pid}) is stopped by a signal: its process is stopped '
            f'(SIGSTOP, Ctrl-Z or a debugger): the others wait for it; '
            f'kill -CONT {victim.pid} continues it') in shown, shown
    assert 'worker 0' not in shown.splitlines()[0]
    assert f'pid {victim.pid}: stopped by a signal, ' in shown

    # Killed (not yet reaped by its parent: a zombie): gone, not running.
    victim.send_signal(signal.SIGKILL)
    shown = _status_until(tmp_path, r': FAILED: ')
    assert (f'worker 1 ({socket.gethostname()}, pid {victim.pid}) is gone: '
            'its process no longer exists and wrote no end (killed: SIGKILL '
            'or the OOM killer; or it crashed)') in shown.splitlines()[0]
    assert f'pid {victim.pid}: gone, ' in shown
    assert workers[0].wait(timeout=120) == errors.EXIT_PEER_FAILED
    shown = answer(tmp_path)
    assert re.search(r': FAILED: worker 1 \(\S+, pid \d+\) is gone: .*; '
                     r'worker 0 exited with code 43: ', shown), shown
  finally:
    for worker in workers:
      if worker.process.poll() is None:
        worker.process.send_signal(signal.SIGCONT)
      worker.kill()
