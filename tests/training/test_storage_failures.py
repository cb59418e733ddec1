"""A full disk and a workdir that vanishes mid-run: one clear line, the
latest whole checkpoint kept, and the same command resumes."""

import json
import os
import shutil
import subprocess

import pytest

from ctl import errors
import helpers


def _command(workdir, *overrides):
  return helpers.ctl_command(
      f'--config={helpers.DIGITS}:smoke', f'--workdir={workdir}',
      '--config.intervals.checkpoint_steps=10', *overrides)


def _one_error_line(output: str) -> str:
  assert 'Traceback' not in output, output[-3000:]
  [line] = [line for line in output.splitlines() if line.startswith('ctl: ')]
  return line


@pytest.fixture
def small_disk(tmp_path):
  """A 2.5 MB filesystem: room for one checkpoint of the digits model."""
  if os.geteuid() != 0:
    pytest.skip('mounting a tmpfs needs root')
  mount = tmp_path / 'disk'
  mount.mkdir()
  subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=2500k', 'tmpfs',
                  str(mount)], check=True)
  try:
    yield mount
  finally:
    subprocess.run(['umount', '-l', str(mount)], check=False)


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_run_resumes_once_freed(small_disk):
  workdir = small_disk / 'run'
  full = subprocess.run(_command(workdir, '--config.num_epochs=50'),
                        cwd=helpers.REPO, env=helpers.env_with(),
                        capture_output=True, text=True, timeout=600)
  assert full.returncode == errors.EXIT_FAILURE, full.stderr[-3000:]
  line = _one_error_line(full.stderr)
  assert line.startswith(f'ctl: error: The disk of {workdir} is full')
  kept = helpers.latest_checkpoint_step(workdir)
  assert kept
  subprocess.run(['mount', '-o', 'remount,size=40m', str(small_disk)],
                 check=True)
  resumed = subprocess.run(_command(workdir, '--config.num_epochs=2'),
                           cwd=helpers.REPO, env=helpers.env_with(),
                           capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f'Training from step {kept} ' in resumed.stderr


@pytest.mark.slow
def test_a_best_checkpoint_the_full_disk_cut_short_is_not_recorded(
    small_disk):
  # Room for 1 MB more: the best checkpoint (1.8 MB), written at the first
  # evaluation before the step's training checkpoint, fails. best.json once
  # named it all the same, and every rerun then failed to export it.
  workdir = small_disk / 'run'
  (small_disk / 'filler').write_bytes(bytes(1_500_000))
  overrides = ('--config.evaluation.best_metric=loss',
               '--config.evaluation.best_mode=max',  # The first stays best.
               '--config.intervals.checkpoint_steps=0')  # Epoch ends only.
  full = subprocess.run(_command(workdir, *overrides), cwd=helpers.REPO,
                        env=helpers.env_with(), capture_output=True,
                        text=True, timeout=600)
  assert full.returncode == errors.EXIT_FAILURE, full.stderr[-3000:]
  line = _one_error_line(full.stderr)
  assert line.startswith(f'ctl: error: The disk of {workdir} is full')
  assert '/best/ckpt-44_temp/' in line
  assert 'Best checkpoint of step 44 written' not in full.stderr
  assert sorted(os.listdir(workdir / 'best')) == []
  (small_disk / 'filler').unlink()
  subprocess.run(['mount', '-o', 'remount,size=40m', str(small_disk)],
                 check=True)
  rerun = subprocess.run(_command(workdir, *overrides), cwd=helpers.REPO,
                         env=helpers.env_with(), capture_output=True,
                         text=True, timeout=600)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  kept = json.loads((workdir / 'best' / 'best.json').read_text())
  assert kept['step'] == 44
  assert sorted(os.listdir(workdir / 'best')) == [
      'best.json', 'ckpt-44.data-00000-of-00001', 'ckpt-44.index']
  assert json.loads((workdir / 'export' / 'export.json').read_text())[
      'checkpoint'] == str(workdir / 'best' / 'ckpt-44')


@pytest.mark.slow
def test_a_workdir_deleted_mid_run_is_one_line(tmp_path):
  workdir = tmp_path / 'run'
  job = helpers.Watched(_command(workdir, '--config.num_epochs=1000'))
  try:
    job.wait_for('First step done')
    shutil.rmtree(workdir)
    # A file where it was: TensorFlow would otherwise create the folders of
    # its next checkpoint anew, and the run would go on.
    workdir.write_text('not a workdir')
    assert job.wait() == errors.EXIT_FAILURE, job.output[-3000:]
  finally:
    job.kill()
  line = _one_error_line(job.output)
  assert line.startswith(f'ctl: error: The workdir {workdir} vanished')
