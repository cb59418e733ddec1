"""TFDS input: a tiny dataset prepared offline in the test (tests/tfds_tiny.py),
read by TFDSSource (each worker its own files, exact resume), the
tfds_mnist config trained by ctl.main, stopped by SIGTERM on 2 workers and
resumed on 1 (the global order), and the errors for what is missing."""

import collections
import os
import random
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from ctl import errors
from ctl.data import tfds as tfds_data
import helpers
import tfds_tiny

CONFIG = str(helpers.REPO / 'configs' / 'tfds_mnist.py')
KEYS = ('image', 'label')


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """A data directory holding tiny_digits, prepared (4 shards a split)."""
  directory = tmp_path_factory.mktemp('tensorflow_datasets')
  tfds_tiny.prepare(directory)
  return directory


def _source(data_dir, split='train'):
  builder = tfds_data.load_builder(tfds_tiny.NAME, str(data_dir))
  return tfds_data.TFDSSource(builder, split, keys=KEYS)


def _context(pipeline=0, num_pipelines=1):
  return tf.distribute.InputContext(num_input_pipelines=num_pipelines,
                                    input_pipeline_id=pipeline,
                                    num_replicas_in_sync=num_pipelines)


def _noisy(features, seed):
  """The image as int32 plus stateless noise: augmentation."""
  image = tf.cast(features['image'], tf.int32)
  noise = tf.random.stateless_uniform(tf.shape(image), seed, 0, 1000,
                                      tf.int32)
  return image + noise, features['label']


def _plain(features, seed):
  del seed
  return features['image'], features['label']


def _examples(images, labels):
  """A multiset of (image bytes, label): what a share of the data holds."""
  return collections.Counter(
      (image.tobytes(), int(label))
      for image, label in zip(np.asarray(images), np.asarray(labels)))


def test_each_pipeline_reads_its_own_files_decoded_as_tfds_decodes(data_dir):
  source = _source(data_dir)
  assert len(source.files) == tfds_tiny.NUM_SHARDS
  features = tfds_data.load_builder(tfds_tiny.NAME,
                                    str(data_dir)).info.features
  for pipeline in range(2):
    # 2 of the 4 files, 719 records: an epoch. (In batches of one: TF 2.21
    # crashed, at times, dropping an iterator while it prefetched a batch
    # of 719.)
    epoch = list(source.train_dataset(
        _context(pipeline, 2), per_replica_batch_size=1, seed=0,
        decode=_plain).take(719))
    images = np.concatenate([images for images, _ in epoch])
    labels = np.concatenate([labels for _, labels in epoch])
    expected = [features.deserialize_example(record) for record in
                tf.data.TFRecordDataset(source.files[pipeline::2])]
    assert _examples(images, labels) == _examples(
        [example['image'] for example in expected],
        [example['label'] for example in expected])


def test_a_restored_iterator_gives_exactly_the_following_batches(data_dir):
  source = _source(data_dir)

  def batches():  # 44 batches of 32 an epoch.
    return iter(source.train_dataset(_context(), per_replica_batch_size=32,
                                     seed=3, decode=_noisy))

  iterator = batches()
  for _ in range(50):  # Into the second epoch.
    next(iterator)
  path = tf.train.Checkpoint(iterator=iterator).write(
      str(data_dir.parent / 'position' / 'ckpt'))
  expected = [next(iterator) for _ in range(45)]  # Across an epoch's end.

  restored = batches()
  tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
  for (images, labels), (want_images, want_labels) in zip(
      [next(restored) for _ in range(45)], expected):
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_array_equal(images, want_images)  # The noise too.


def test_eval_pipelines_read_every_record_once(data_dir):
  source = _source(data_dir, 'test')
  shares = [
      [int(label) for _, labels in source.eval_dataset(
          _context(pipeline, 2), per_replica_batch_size=100, decode=_plain)
       for label in labels] for pipeline in range(2)]
  assert len(shares[0]) + len(shares[1]) == len(source) == 359
  assert sorted(shares[0] + shares[1]) == sorted(
      int(example['label']) for example in tfds_data.load_builder(
          tfds_tiny.NAME, str(data_dir)).as_dataset(split='test'))


def test_a_prepared_version_directory_is_read_without_a_name(data_dir):
  directory = data_dir / tfds_tiny.NAME / '1.0.0'
  builder = tfds_data.load_builder('', str(directory))
  assert builder.info.full_name == f'{tfds_tiny.NAME}/1.0.0'
  assert len(tfds_data.TFDSSource(builder, 'train', keys=KEYS)) == 1438


@pytest.mark.parametrize('split, keys, message', [
    ('validation', KEYS, r"no split 'validation'; it has \['test', 'train'\]"),
    ('train[:50%]', KEYS, r'no split .*slices .* are not read'),
    ('train', ('image', 'digit'), r"no feature 'digit'; it has \['image', "
     r"'label'\]"),
], ids=['split', 'slice', 'feature'])
def test_what_the_dataset_lacks_is_named(data_dir, split, keys, message):
  builder = tfds_data.load_builder(tfds_tiny.NAME, str(data_dir))
  with pytest.raises(errors.CtlError, match=message):
    tfds_data.TFDSSource(builder, split, keys=keys)


def test_an_unprepared_dataset_says_how_to_prepare_it(tmp_path):
  # tiny_digits's builder class is known here (tfds_tiny is imported), but
  # tmp_path holds none of its files: ctl does not prepare it.
  with pytest.raises(errors.CtlError, match=(
      r"TFDS dataset 'tiny_digits' is not prepared in .* \(it holds \[\]\)\. "
      r"ctl never downloads: prepare it .* with `python -c 'import "
      r'tensorflow_datasets as tfds; tfds.builder\("tiny_digits", '
      r'data_dir=".*"\).download_and_prepare\(\)\'`')):
    tfds_data.load_builder(tfds_tiny.NAME, str(tmp_path))
  assert not list(tmp_path.iterdir())


def test_a_dataset_neither_prepared_nor_known_says_how_to_prepare_it(
    data_dir):
  # As ctl.main sees tiny_digits in an empty directory: no builder class.
  with pytest.raises(errors.CtlError, match=(
      r"TFDS dataset 'no_such_set' is not prepared in .* \(it holds "
      r"\[.*'tiny_digits'\]\)\. ctl never downloads")):
    tfds_data.load_builder('no_such_set', str(data_dir))


def test_without_tensorflow_datasets_the_message_says_what_to_install(
    data_dir, monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)
  with pytest.raises(errors.CtlError,
                     match=r'needs tensorflow-datasets, which is not '
                     r'installed .*pip install -e "\.\[tfds\]"'):
    tfds_data.load_builder(tfds_tiny.NAME, str(data_dir))


def test_ctl_imports_tensorflow_datasets_only_to_read_tfds():
  code = ('import sys; import ctl.main, ctl.builtin_tasks, ctl.training.run; '
          "print('tensorflow_datasets' in sys.modules)")
  done = subprocess.run([sys.executable, '-c', code], cwd=helpers.REPO,
                        env=helpers.env_with(), capture_output=True,
                        text=True, timeout=300)
  assert done.stdout.strip() == 'False', done.stderr[-3000:]


def _args(data_dir, workdir, *extra):
  """The smoke config on tiny_digits: 2 epochs of 22 steps of 64."""
  return (f'--config={CONFIG}:smoke', f'--workdir={workdir}',
          f'--config.data.tfds.name={tfds_tiny.NAME}',
          f'--config.data.tfds.data_dir={data_dir}',
          '--config.data.tfds.feature_scale=0.0625',  # Pixels are 0..16.
          '--config.steps_per_epoch=0', '--config.num_epochs=2', *extra)


def test_missing_data_is_one_error_line_and_nothing_is_written(tmp_path):
  done = helpers.run_ctl(*_args(tmp_path / 'absent', tmp_path / 'work'))
  assert done.returncode == errors.EXIT_FAILURE, done.stderr[-3000:]
  lines = [line for line in done.stderr.splitlines()
           if line.startswith('ctl: error:')]
  assert len(lines) == 1 and 'ctl never downloads' in lines[0], (
      done.stderr[-3000:])
  assert 'absent does not exist' in lines[0]
  assert 'download_and_prepare()' in lines[0]
  assert 'Traceback' not in done.stderr
  assert not (tmp_path / 'work').exists()


def test_a_corrupt_record_stops_training_with_its_file_named(data_dir,
                                                              tmp_path):
  # TFDS's metadata counts the records: the files are not read through at
  # start, and the bad record is named when training reads it.
  copy = tmp_path / 'tensorflow_datasets'
  shutil.copytree(data_dir, copy)
  path = sorted(copy.glob(f'{tfds_tiny.NAME}/*/*-train.tfrecord-*'))[1]
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  path.write_bytes(bytes(data))
  done = helpers.run_ctl(*_args(copy, tmp_path / 'work'))
  assert done.returncode == errors.EXIT_FAILURE, done.stderr[-3000:]
  lines = [line for line in done.stderr.splitlines()
           if line.startswith('ctl: error:')]
  assert len(lines) == 1, done.stderr[-3000:]
  assert re.search(rf'Training read a bad record: .*{re.escape(path.name)} '
                   'is not a whole TFRecord file', lines[0]), lines[0]
  assert 'Traceback' not in done.stderr
  assert not (tmp_path / 'work' / 'results.json').exists()


TOTAL_STEPS = 44  # 2 epochs of 1438 // 64 steps.


EXTRA = ('--config.deterministic=True', '--config.data.tfds.shift=1',
         '--config.intervals.log_steps=1')


def _start(data_dir, workdir, num_workers=1) -> list[helpers.Watched]:
  """Shifted images, deterministic ops, on 1 worker or more."""
  command = helpers.ctl_command(*_args(data_dir, workdir, *EXTRA))
  if num_workers == 1:
    return [helpers.Watched(command)]
  return [helpers.Watched(command, env)
          for env in helpers.cluster_envs(num_workers)]


@pytest.fixture(scope='module')
def reference(data_dir, tmp_path_factory):
  """The workdir of an uninterrupted run on 1 worker."""
  workdir = tmp_path_factory.mktemp('reference')
  [job] = _start(data_dir, workdir)
  assert job.wait() == 0, job.output[-3000:]
  results = helpers.read_results(workdir)
  assert results['step'] == TOTAL_STEPS
  assert results['eval']['accuracy'] > 0.5  # Chance: 0.1.
  return workdir


@pytest.mark.slow
def test_the_smoke_config_trains_offline_on_a_stand_in_ctl_prepares(
    tmp_path):
  env = helpers.env_with(HOME=str(tmp_path / 'home'))
  done = helpers.run_ctl(f'--config={CONFIG}:smoke',
                         f'--workdir={tmp_path / "work"}', env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'ctl_mnist_standin: generated random images' in done.stderr
  assert (tmp_path / 'home' / '.cache' / 'ctl' / 'tensorflow_datasets' /
          'ctl_mnist_standin' / '1.0.0' / 'dataset_info.json').exists()
  assert helpers.read_results(tmp_path / 'work')['step'] == 5


@pytest.mark.slow
def test_stopped_on_two_workers_resumes_on_one(data_dir, reference,
                                               tmp_path):
  """The global order: the run on 1 worker reads the global batches that
  2 workers would, so it ends with the uninterrupted 1-worker run's
  weights (within float tolerance: the 2 workers summed in another
  order)."""
  seed = int(os.environ.get('CTL_TFDS_SEED', random.randrange(10**6)))
  print(f'seed {seed} (CTL_TFDS_SEED={seed} reproduces it)')
  target = random.Random(seed).randint(5, 30)
  workdir = tmp_path / 'run'
  jobs = _start(data_dir, workdir, num_workers=2)
  jobs[0].wait_for(rf'step {target}/')
  jobs[0].process.send_signal(signal.SIGTERM)
  assert [job.wait() for job in jobs] == [errors.EXIT_PREEMPTED] * 2, (
      jobs[0].output[-3000:])
  step = int(re.search(r'Stopped by SIGTERM after step (\d+)',
                       jobs[0].output).group(1))
  assert not (workdir / 'checkpoints' / 'data').exists()  # Step = position.
  [resumed] = _start(data_dir, workdir)
  assert resumed.wait() == 0, resumed.output[-3000:]
  assert f'Training from step {step} to {TOTAL_STEPS}' in resumed.output
  assert ('Resumed on 1 worker(s); the checkpoint was written by 2; same '
          'data order') in resumed.output
  final = f'checkpoints/ckpt-{TOTAL_STEPS}'
  # Adam's per-weight scaling carries the summation order's rounding into
  # the weights (2e-5 seen); another data order moves them by far more.
  helpers.assert_same_model(workdir / final, reference / final, atol=1e-4)
