"""A full disk and a workdir that vanishes mid-run: one clear line, the
latest whole checkpoint kept, and the same command resumes."""

import json
import os
import random
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


def _delete(folder) -> None:
  """rm -rf, again while a writer still creates files in it."""
  while folder.exists():
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize('seed', [0, 1, 2])
def test_a_workdir_deleted_mid_run_is_one_line(tmp_path, seed):
  # Deleted after a log line the seed picks: a checkpoint or best just
  # handed to TensorFlow's background writer, an evaluation, a log line.
  # Raw tracebacks and TensorFlow's "Exception ignored in atexit callback"
  # once followed, or the run went on in folders created anew.
  rng = random.Random(seed)
  moment = rng.choice([r'Saved .*/checkpoints/ckpt-{}$',
                       r'New best loss .* at step {}:',
                       r'eval at step {}:', r'\] step {}/'])
  moment = moment.format(11 * rng.randint(2, 8) if 'ckpt' not in moment
                         else 10 * rng.randint(2, 8))
  print(f'seed {seed}: the workdir is deleted after a line matching '
        f'{moment!r}')
  workdir = tmp_path / 'run'
  job = helpers.Watched(_command(
      workdir, '--config.num_epochs=1000', '--config.intervals.eval_steps=11',
      '--config.evaluation.best_metric=loss',
      '--config.evaluation.best_mode=min'))
  try:
    job.wait_for(moment)
    _delete(workdir)
    assert job.wait() == errors.EXIT_FAILURE, job.output[-3000:]
  finally:
    job.kill()
  assert 'Exception ignored' not in job.output, job.output[-3000:]
  line = _one_error_line(job.output)
  assert line.startswith((f'ctl: error: The workdir {workdir} vanished',
                          f'ctl: error: Files of the workdir {workdir} '
                          'vanished')), line
