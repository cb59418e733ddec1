"""A ctl process's folders in the temporary directory (a worker's part of a
save, an export's staging): a killed process's are removed by the next ctl
process of its host; a live one's, and others' files, are kept."""

import subprocess
import sys

import pytest
import tensorflow as tf

from ctl.checkpoints import manager
from ctl.runtime import workdir
import helpers

# Makes the folders a non-chief worker and an export make, until killed.
_HOLD = '''
import os
import sys
from ctl.runtime import workdir
os.makedirs(workdir.scratch_path('workertemp_1'))
workdir.make_scratch_folder('export-staging')
print('made', flush=True)
sys.stdin.read()
'''


def _hold(env, count: int) -> list[subprocess.Popen]:
  """Processes holding their folders, once they are made."""
  holders = [subprocess.Popen([sys.executable, '-c', _HOLD], cwd=helpers.REPO,
                              env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
             for _ in range(count)]
  for holder in holders:
    assert holder.stdout.readline() == 'made\n'
  return holders


def _folders(directory, pid: int) -> list[str]:
  return sorted(path.name for path in directory.glob(f'ctl-{pid}-*'))


@pytest.mark.slow
def test_the_next_ctl_process_removes_a_killed_ones_folders(tmp_path):
  temporary = tmp_path / 'tmp'
  temporary.mkdir()
  env = helpers.env_with(TMPDIR=str(temporary))
  killed, alive = _hold(env, 2)
  try:
    killed.kill()
    killed.wait()
    assert len(_folders(temporary, killed.pid)) == 2
    kept = _folders(temporary, alive.pid)
    others = ['ctl-postgres-x1', f'ctl-sweep-{killed.pid}-trial.log']
    (temporary / others[0]).mkdir()
    (temporary / others[1]).write_text('a sweep trial\'s log')
    # Any ctl command does it, even one that fails at once.
    run = helpers.run_ctl(f'--config={helpers.DIGITS}', '--mode=export',
                          f'--workdir={tmp_path / "none"}', env=env)
    assert run.returncode == 1, run.stderr[-3000:]
    assert 'has no checkpoint (best): train first' in run.stderr
    assert 'Traceback' not in run.stderr  # It made its folders there first.
    assert not (tmp_path / 'none').exists()
    assert 'left by a ctl process that was killed' in run.stderr
    assert not _folders(temporary, killed.pid)
    assert _folders(temporary, alive.pid) == kept
    assert all((temporary / name).exists() for name in others)
  finally:
    alive.kill()
    alive.wait()


def test_a_non_chief_worker_saves_through_a_folder_of_its_own(tmp_path):
  checkpointer = manager.Checkpointer(
      tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), is_chief=False,
      task_id=1, max_to_keep=1)
  # Named for the clean-up above, if the worker is killed during a save.
  assert checkpointer._scratch_directory == workdir.scratch_path('workertemp_1')  # pylint: disable=protected-access
  checkpointer.save(1)
  assert not list(tmp_path.iterdir())
