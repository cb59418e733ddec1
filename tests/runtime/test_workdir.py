"""One trainer per workdir: a second is refused at once, naming the first;
a killed one leaves nothing held."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from ctl import errors
from ctl.runtime import workdir as workdir_lib
from ctl.training import run
import helpers

# Holds the lock a trainer takes, until killed.
_HOLD = '''
import sys
from ctl.runtime import workdir
with workdir.Lock(sys.argv[1]):
  print('held', flush=True)
  sys.stdin.read()
'''


def test_a_workdir_held_by_a_process_is_refused_until_it_is_killed(tmp_path):
  holder = subprocess.Popen([sys.executable, '-c', _HOLD, str(tmp_path)],
                            cwd=helpers.REPO, env=helpers.env_with(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
  try:
    assert holder.stdout.readline() == 'held\n'
    before = helpers.file_stamps(tmp_path)
    with pytest.raises(errors.WorkdirInUse,
                       match=rf'process {holder.pid} on this host'):
      run.train_and_evaluate(helpers.digits(1), str(tmp_path))
    assert helpers.file_stamps(tmp_path) == before
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  # The kernel released it with the process: no stale lock.
  assert run.train_and_evaluate(helpers.digits(1), str(tmp_path))['step'] == 44


def test_a_lock_is_taken_once_the_workdir_exists_and_released_on_exit(
    tmp_path):
  workdir = tmp_path / 'new'
  with workdir_lib.Lock(str(workdir)) as lock:
    workdir.mkdir()
    lock.acquire()
    with pytest.raises(errors.WorkdirInUse):
      with workdir_lib.Lock(str(workdir)):
        pass
  with workdir_lib.Lock(str(workdir)):
    pass


@pytest.mark.slow
def test_the_same_command_submitted_twice_runs_once(tmp_path):
  command = helpers.ctl_command(f'--config={helpers.DIGITS}:smoke',
                                f'--workdir={tmp_path}',
                                '--config.num_epochs=100000')
  first = helpers.Watched(command)
  try:
    first.wait_for('First step done')
    second = helpers.run_ctl(*command[3:])
    assert second.returncode == errors.EXIT_USAGE, second.stderr[-2000:]
    [line] = [line for line in second.stderr.splitlines()
              if line.startswith('ctl: ')]
    assert line.startswith(f'ctl: error: Another job trains in workdir '
                           f'{tmp_path} (process {first.process.pid} ')
    first.process.send_signal(signal.SIGTERM)
    assert first.wait() == errors.EXIT_PREEMPTED
  finally:
    first.kill()


def test_what_a_kill_left_of_a_json_write_is_removed_at_the_next_start(
    tmp_path):
  gone = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'],
                        capture_output=True, text=True, check=True)
  dead, host = int(gone.stdout), socket.gethostname()
  (tmp_path / 'eval').mkdir(parents=True)
  leftovers = [tmp_path / f'config.json.tmp-{host}-{dead}',
               tmp_path / 'eval' / f'results.json.tmp-{host}-{dead}']
  in_use = [tmp_path / f'results.json.tmp-{host}-{os.getppid()}',
            tmp_path / f'results.json.tmp-another-host-{dead}']
  for path in leftovers + in_use:
    path.write_text('{"half": ')
  run.train_and_evaluate(helpers.digits(1), str(tmp_path))
  assert not [path for path in leftovers if path.exists()]
  assert all(path.exists() for path in in_use)
