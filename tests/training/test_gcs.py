"""A workdir and data on gs://, through TensorFlow's own GCS client and a
GCS API server on localhost (tests/gcs_server.py): training stopped and
resumed bit for bit, 2 workers with one killed, the side-car, export and
ctl.load, TFRecord shards, a sweep trial, and the store going away during
a save."""

import os
import random
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ctl
from ctl import errors
from ctl import modes
from ctl import status as status_lib
from ctl import storage
from ctl.data import datasets
from ctl.training import run
import helpers

pytestmark = pytest.mark.slow

SEED = int(os.environ.get('CTL_GCS_SEED', random.randrange(10**6)))
# 88 steps of 44 an epoch, a checkpoint every 11.
ARGS = (f'--config={helpers.DIGITS}', '--config.num_epochs=2',
        '--config.deterministic=True', '--config.intervals.log_steps=1',
        '--config.intervals.checkpoint_steps=11')


def _config(**fields):
  """ARGS' config, for a run in this process."""
  return helpers.digits(2, deterministic=True, **{
      'intervals.log_steps': 1, 'intervals.checkpoint_steps': 11}, **fields)


def _env(server, **variables):
  return helpers.env_with(**server.env(), **variables)


def _stop_step(name: str) -> int:
  print(f'seed {SEED} (CTL_GCS_SEED={SEED} reproduces it)')
  return random.Random(f'{SEED}-{name}').randint(20, 70)


@pytest.fixture(scope='module')
def local_run(tmp_path_factory) -> str:
  """The digits job in a local workdir: its final weights' fingerprint."""
  workdir = tmp_path_factory.mktemp('local')
  reference = helpers.run_ctl(*ARGS, f'--workdir={workdir}')
  assert reference.returncode == 0, reference.stderr[-3000:]
  return helpers.fingerprint(reference.stderr)[0]


def test_sigterm_mid_epoch_resumes_on_gcs_as_a_local_run_ends(
    gcs_server, local_run, tmp_path, caplog):
  workdir = gcs_server.url('digits')
  stop = _stop_step('sigterm')
  job = helpers.Watched(helpers.ctl_command(*ARGS, f'--workdir={workdir}'),
                        _env(gcs_server))
  try:
    job.wait_for(rf'step {stop}/88 ', timeout=600)  # TensorFlow started.
    job.process.send_signal(signal.SIGTERM)
    code = job.wait()
  finally:
    job.kill()
  assert code == errors.EXIT_PREEMPTED, job.output[-3000:]
  # Each worker's status file is on gs:// too: ctl.status reads it.
  assert f'{workdir}: STOPPED: worker 0 exited with code 42' in (
      status_lib.render(workdir))
  resumed = helpers.Watched(
      helpers.ctl_command(*ARGS, f'--workdir={workdir}'), _env(gcs_server))
  assert resumed.wait() == 0, resumed.output[-3000:]
  assert 'Training from step ' in resumed.output
  assert helpers.fingerprint(resumed.output) == [local_run]
  # Everything a run writes is there, and reads back.
  names = storage.listdir(workdir)
  for name in ('config.json', 'results.json', 'checkpoints', 'train', 'eval',
               'best', 'export', 'workers'):
    assert name in names, names
  assert 'FINISHED: training finished (exit code 0)' in status_lib.render(
      workdir)
  assert storage.read_json(storage.join(workdir, 'results.json'))['step'] == 88
  loaded = ctl.load(workdir)
  probabilities = loaded.serve(tf.zeros([2, 8, 8]))['probabilities']
  assert probabilities.shape == (2, 10)
  # --mode=export again, from gs:// to gs://, staged in the local
  # temporary directory: killed there, it leaves no folder on this machine
  # once a ctl process runs again.
  scratch = tmp_path / 'scratch'
  scratch.mkdir()
  command = helpers.ctl_command(*ARGS, f'--workdir={workdir}', '--mode=export')
  env = _env(gcs_server, TMPDIR=str(scratch))
  job = subprocess.Popen(command, cwd=helpers.REPO, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    helpers.wait_for_glob(scratch, '*export*', job)
  finally:
    job.kill()
    job.wait()
  export = helpers.run_ctl(*command[3:], env=env)
  assert export.returncode == 0, export.stderr[-3000:]
  assert 'Exported the best checkpoint' in export.stderr
  assert not list(scratch.glob('*export*'))  # The killed one's too.
  assert storage.exists(storage.join(workdir, 'export', 'export.json'))
  # --mode=evaluate reads the checkpoint there; init_from starts a local
  # run from its weights (both in this process, which reaches the store
  # too: what is read from gs:// is tested, not a process of its own).
  modes.run('evaluate', _config(), workdir)
  assert storage.read_json(storage.join(workdir, 'eval', 'results.json'))[
      'step'] == 88
  caplog.set_level('INFO')
  run.train_and_evaluate(_config(total_steps=1, init_from=workdir),
                         str(tmp_path / 'warm'))
  assert f'Warm start from {workdir}' in caplog.text


def test_two_workers_on_gcs_resume_after_one_is_killed(gcs_server, tmp_path):
  args = (*ARGS, '--config.export.at_end=False')  # Export: the test above.
  reference = helpers.run_workers(
      [*args, f'--workdir={tmp_path / "local"}'], helpers.cluster_envs(2),
      tmp_path)
  assert reference == [0, 0]
  expected = helpers.fingerprint((tmp_path / 'worker0.log').read_text())
  workdir = gcs_server.url('workers')
  stop = _stop_step('sigkill')
  envs = helpers.cluster_envs(2, **gcs_server.env())
  jobs = [helpers.Watched(helpers.ctl_command(*args, f'--workdir={workdir}'),
                          env) for env in envs]
  try:
    jobs[1].wait_for(rf'step {stop}/88 ', timeout=600)
    jobs[1].process.send_signal(signal.SIGKILL)
    codes = [job.wait() for job in jobs]
  finally:
    for job in jobs:
      job.kill()
  assert codes[1] == -signal.SIGKILL and codes[0] != 0, codes
  envs = helpers.cluster_envs(2, **gcs_server.env())
  jobs = [helpers.Watched(helpers.ctl_command(*args, f'--workdir={workdir}'),
                          env) for env in envs]
  assert [job.wait() for job in jobs] == [0, 0], jobs[0].output[-3000:]
  assert 'Training from step ' in jobs[0].output
  assert helpers.fingerprint(jobs[0].output) == expected


def test_a_side_car_on_gcs_evaluates_checkpoints_and_keeps_the_best(
    gcs_server, tmp_path):
  workdir = gcs_server.url('sidecar')
  command = helpers.ctl_command(*ARGS, f'--workdir={workdir}',
                                '--config.intervals.keep_checkpoints=2')
  # It reads local copies of the checkpoints, in the temporary folder.
  side_car = helpers.Watched([*command, '--mode=evaluate_continuously',
                              '--config.intervals.eval_steps=0'],
                             _env(gcs_server, TMPDIR=str(tmp_path)))
  try:
    side_car.wait_for('Evaluating each new checkpoint', timeout=600)
    trainer = helpers.Watched([*command, '--config.evaluation.best_metric=',
                               '--config.export.at_end=False'],
                              _env(gcs_server))
    assert trainer.wait() == 0, trainer.output[-3000:]
    assert side_car.wait(timeout=300) == 0, side_car.output[-3000:]
  finally:
    side_car.kill()
  steps = [int(line.split('eval at step ')[1].split(':')[0])
           for line in side_car.output.splitlines() if 'eval at step ' in line]
  assert len(steps) > 1 and steps[-1] == 88 and steps == sorted(steps)
  assert not list(tmp_path.iterdir())  # The copies removed.
  best = storage.read_json(storage.join(workdir, 'best', 'best.json'))
  assert best['step'] in steps
  assert storage.exists(storage.join(workdir, 'best', best['checkpoint'] +
                                     '.index'))


def test_a_sweep_trial_on_gcs_writes_tfrecord_shards_then_trains_on_them(
    gcs_server, tmp_path):
  data = gcs_server.url('shards')
  sweep_file = tmp_path / 'sweep.py'
  sweep_file.write_text(
      'from ctl import hyper\n'
      'def get_sweep():\n'
      '  return hyper.Sweep(\n'
      f'      config="{helpers.REPO}/configs/digits_tfrecord.py:smoke",\n'
      f'      trials=[{{"data.tfrecord.dir": "{data}",\n'
      '               "export.at_end": False}])\n')
  workdir = gcs_server.url('sweep')
  sweep = helpers.Watched([sys.executable, '-m', 'ctl.sweep',
                           f'--sweep={sweep_file}', f'--workdir={workdir}'],
                          _env(gcs_server))
  assert sweep.wait(timeout=600) == 0, sweep.output[-3000:]
  [trial] = [name for name in storage.listdir(workdir)
             if storage.isdir(storage.join(workdir, name))]
  trial_dir = storage.join(workdir, trial)
  results = storage.read_json(storage.join(trial_dir, 'results.json'))
  assert results['step'] and results['eval']['accuracy'] > 0.5
  assert 'Results written' in storage.read_text(
      storage.join(trial_dir, 'log.txt'))
  assert storage.read_json(storage.join(trial_dir, 'trial.json'))[
      'exit_code'] == 0
  assert storage.exists(storage.join(data, 'features.json'))
  assert storage.glob(storage.join(data, 'train-*'))


def test_the_store_going_away_during_saves_loses_nothing(gcs_server):
  workdir = gcs_server.url('outage')
  args = (*ARGS, f'--workdir={workdir}', '--config.total_steps=30',
          '--config.steps_per_loop=1', '--config.export.at_end=False')
  # A checkpoint every step: each outage falls on saves.
  job = helpers.Watched(helpers.ctl_command(
      *args, '--config.intervals.checkpoint_steps=1'), _env(gcs_server))
  try:
    # Down for 5 s: TensorFlow's retries ride it out, or the run stops
    # as below.
    job.wait_for(r'step 6/30 ', timeout=600)  # TensorFlow started.
    gcs_server.stop_front()
    try:
      job.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
      pass
    finally:
      gcs_server.start_front()
    if job.process.poll() is None:
      job.wait_for(r'step 14/30 ')  # It went on.
      # Down until the run gives up: one line, a restart code.
      gcs_server.stop_front()
      try:
        code = job.wait(timeout=300)
      finally:
        gcs_server.start_front()
    else:
      code = job.wait()
  finally:
    job.kill()
  assert code == errors.EXIT_PEER_FAILED, job.output[-3000:]
  [line] = [line for line in job.output.splitlines() if 'ctl: error: ' in line]
  assert f'The store of workdir {workdir} did not answer' in line
  # Resumed with ARGS' checkpoint every 11 steps (where it resumes from is
  # what is tested, not its own saves).
  resumed = helpers.Watched(helpers.ctl_command(*args), _env(gcs_server))
  assert resumed.wait() == 0, resumed.output[-3000:]
  # From the latest whole checkpoint, written before the store went away.
  step = int(re.search(r'Training from step (\d+)', resumed.output).group(1))
  assert step >= 6
  assert storage.read_json(storage.join(workdir, 'results.json'))['step'] == 30


def _upload(folder, url: str) -> None:
  """Copies local folder `folder` (a pathlib.Path) to gs:// folder url."""
  for path in sorted(folder.rglob('*')):
    if path.is_file():
      storage.makedirs(storage.join(url, str(path.parent.relative_to(folder))))
      storage.copy(str(path), storage.join(url,
                                            str(path.relative_to(folder))))


def test_a_tfds_dataset_on_gcs_trains(gcs_server, tmp_path):
  import tfds_tiny  # pylint: disable=g-import-not-at-top
  local = tmp_path / 'tensorflow_datasets'
  tfds_tiny.prepare(local)
  data_dir = gcs_server.url('tfds')
  _upload(local, data_dir)
  workdir = gcs_server.url('tfds-run')
  # A process of its own: there TFDS finds the prepared files by name,
  # without tfds_tiny's builder (imported in this one), as a user's does.
  tfds_run = helpers.run_ctl(
      f'--config={helpers.REPO}/configs/tfds_mnist.py:smoke',
      f'--workdir={workdir}', f'--config.data.tfds.name={tfds_tiny.NAME}',
      f'--config.data.tfds.data_dir={data_dir}',
      '--config.data.tfds.feature_scale=0.0625', '--config.steps_per_epoch=0',
      '--config.num_epochs=2', '--config.export.at_end=False',
      env=_env(gcs_server))
  assert tfds_run.returncode == 0, tfds_run.stderr[-3000:]
  results = storage.read_json(storage.join(workdir, 'results.json'))
  assert results['step'] == 44 and results['eval']['accuracy'] > 0.5


def test_an_mnist_file_on_gcs_trains(gcs_server, tmp_path):
  """config.data.path on gs://: an .npz of MNIST's layout (digits, padded)."""
  digits = datasets.load_digits(helpers.digits().data)

  def padded(split):
    return np.pad(split.features * 15, ((0, 0), (10, 10), (10, 10)))
  local = tmp_path / 'mnist.npz'
  np.savez(local, x_train=padded(digits.train), y_train=digits.train.labels,
           x_test=padded(digits.eval), y_test=digits.eval.labels)
  path = storage.join(gcs_server.url('mnist'), 'mnist.npz')
  storage.makedirs(os.path.dirname(path))
  storage.copy(str(local), path)
  workdir = gcs_server.url('mnist-run')
  # In this process: reading from gs:// is tested, not a process.
  run.train_and_evaluate(helpers.override(
      helpers.load_config('mnist', 'smoke'), **{
          'data.name': 'mnist', 'data.path': path, 'export.at_end': False}),
                         workdir)
  assert storage.read_json(storage.join(workdir, 'results.json'))['step']
