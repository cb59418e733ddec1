"""TFRecord input: sharding, determinism, exact resume, bad input, the write
command, and the digits_tfrecord config trained in-process and on 2
workers stopped by SIGTERM."""

import json
import logging
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from ctl import errors
from ctl.data import datasets
from ctl.data import tfrecord
from ctl.data import tfrecord_files
from ctl.data import write_tfrecords
from ctl.runtime import tf_internals
from ctl.training import failures
from ctl.training import run
import helpers

SPEC = {'image': tf.io.FixedLenFeature([], tf.string),
        'label': tf.io.FixedLenFeature([], tf.int64)}
CONFIG = str(helpers.REPO / 'configs' / 'digits_tfrecord.py')


def _write_files(directory, num_files=4, per_file=12):
  """Files f0..; record i of file f has label f * 1000 + i and 4 bytes."""
  directory.mkdir(parents=True, exist_ok=True)
  for file_index in range(num_files):
    with tf.io.TFRecordWriter(str(directory / f'part-{file_index}.tfrecord')
                              ) as writer:
      for record in range(per_file):
        example = tf.train.Example(features=tf.train.Features(feature={
            'image': tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[bytes([file_index, record, 0, 0])])),
            'label': tf.train.Feature(int64_list=tf.train.Int64List(
                value=[file_index * 1000 + record])),
        }))
        writer.write(example.SerializeToString())
  return str(directory / 'part-*.tfrecord')


def _decode(features, seed):
  """Bytes as int32, plus stateless noise when training: augmentation."""
  image = tf.cast(tf.io.decode_raw(features['image'], tf.uint8), tf.int32)
  if seed is not None:
    image += tf.random.stateless_uniform([4], seed, 0, 1000, tf.int32)
  return image, features['label']


def _context(pipeline=0, num_pipelines=1):
  return tf.distribute.InputContext(num_input_pipelines=num_pipelines,
                                    input_pipeline_id=pipeline,
                                    num_replicas_in_sync=num_pipelines)


def _train(pattern, context=None, seed=0, batch=2, epochs=1, **kwargs):
  """The first `epochs` epochs of the training batches; None: endless."""
  context = context or _context()
  source = tfrecord.TFRecordSource(pattern, SPEC)
  dataset = source.train_dataset(context, per_replica_batch_size=batch,
                                 seed=seed, decode=_decode, **kwargs)
  if epochs is None:
    return dataset
  return dataset.take(epochs * source.steps_per_epoch(context, batch))


def _labels(dataset):
  return [int(label) for _, labels in dataset for label in labels]


def test_files_are_sharded_by_file_across_pipelines(tmp_path):
  pattern = _write_files(tmp_path, num_files=4, per_file=12)
  shares = [_labels(_train(pattern, _context(pipeline, 2)))
            for pipeline in range(2)]
  # Pipeline 0 reads files 0 and 2, pipeline 1 files 1 and 3: every record.
  assert {label // 1000 for label in shares[0]} == {0, 2}
  assert {label // 1000 for label in shares[1]} == {1, 3}
  assert sorted(shares[0] + shares[1]) == sorted(
      f * 1000 + i for f in range(4) for i in range(12))


def test_fewer_files_than_pipelines_shards_by_record_with_a_warning(
    tmp_path, caplog):
  pattern = _write_files(tmp_path, num_files=1, per_file=12)
  with caplog.at_level(logging.WARNING):
    shares = [_labels(_train(pattern, _context(pipeline, 2)))
              for pipeline in range(2)]
  assert '1 TFRecord file(s)' in caplog.text
  assert 'keeps 1 record in 2' in caplog.text
  assert len(shares[0]) == len(shares[1]) == 6
  assert sorted(shares[0] + shares[1]) == list(range(12))


def test_an_empty_file_is_named_and_left_out(tmp_path, caplog):
  pattern = _write_files(tmp_path, num_files=3, per_file=12)
  empty = tmp_path / 'part-1.tfrecord'
  empty.write_bytes(b'')
  with caplog.at_level(logging.WARNING):
    source = tfrecord.TFRecordSource(pattern, SPEC)
  assert f'hold no records and are left out (a writer that failed?): {empty}' in caplog.text
  # Files 0 and 2 are shared by the two pipelines: neither reads nothing.
  assert source.steps_per_epoch(_context(0, 2), 2) == 6
  shares = [_labels(_train(pattern, _context(pipeline, 2)))
            for pipeline in range(2)]
  assert sorted(shares[0] + shares[1]) == sorted(
      f * 1000 + i for f in (0, 2) for i in range(12))


def test_pipelines_fill_the_same_number_of_batches(tmp_path):
  # Files of 12, 3, 12, 3 records: pipeline 0 reads 24, pipeline 1 reads
  # 6, so each yields 3 batches of 2 (workers must agree on the steps).
  for index, per_file in enumerate((12, 3, 12, 3)):
    _write_files(tmp_path / str(index), num_files=1, per_file=per_file)
    os.rename(tmp_path / str(index) / 'part-0.tfrecord',
              tmp_path / f'part-{index}.tfrecord')
  pattern = str(tmp_path / 'part-*.tfrecord')
  lengths = [len(list(_train(pattern, _context(pipeline, 2))))
             for pipeline in range(2)]
  assert lengths == [3, 3]


def test_same_seed_same_batches_another_seed_another_order(tmp_path):
  pattern = _write_files(tmp_path)
  first = _labels(_train(pattern, seed=1, epochs=2))
  assert first == _labels(_train(pattern, seed=1, epochs=2))
  assert first != _labels(_train(pattern, seed=2, epochs=2))
  assert sorted(first[:48]) == sorted(first[48:])  # Each epoch: every record.


def test_file_order_is_reshuffled_each_epoch(tmp_path):
  pattern = _write_files(tmp_path, num_files=4, per_file=3)
  # One file at a time and no record shuffle: the files' order shows.
  labels = _labels(_train(pattern, batch=3, shuffle_buffer=1,
                          cycle_length=1, epochs=4))
  orders = [tuple(label // 1000 for label in labels[start:start + 12:3])
            for start in range(0, 48, 12)]
  assert all(sorted(order) == [0, 1, 2, 3] for order in orders)
  assert len(set(orders)) > 1, orders


def test_a_restored_iterator_gives_exactly_the_following_batches(tmp_path):
  pattern = _write_files(tmp_path)
  iterator = iter(_train(pattern, seed=3, epochs=None))
  for _ in range(30):  # Into the second epoch (24 batches each).
    next(iterator)
  checkpoint = tf.train.Checkpoint(iterator=iterator)
  path = checkpoint.write(str(tmp_path / 'position' / 'ckpt'))
  expected = [next(iterator) for _ in range(25)]  # Across an epoch's end.

  restored = iter(_train(pattern, seed=3, epochs=None))
  tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
  for (images, labels), (want_images, want_labels) in zip(
      [next(restored) for _ in range(25)], expected):
    np.testing.assert_array_equal(labels, want_labels)
    # The augmentation's noise too, drawn from the saved seeds.
    np.testing.assert_array_equal(images, want_images)


def test_the_position_is_an_ordinary_iterator_checkpoint(tmp_path):
  """Not a symbolic one: with it, TF 2.21 saves the parallel interleave at
  every element and can segfault when the iterator is dropped mid-read
  (tf_internals.symbolic_checkpoint_hazard; BUILD.md)."""
  dataset = _train(_write_files(tmp_path), epochs=None)
  assert not dataset.options().experimental_symbolic_checkpoint
  assert tf_internals.symbolic_checkpoint_hazard(dataset) is None


# Iterators of the training pipeline dropped after a few batches each, while
# tf.data's threads read ahead: the moment a symbolic checkpoint segfaulted.
_DROPPED_ITERATORS = '''
import random, sys
import tensorflow as tf
from ctl.data import tfrecord
pattern, seed, symbolic = sys.argv[1], int(sys.argv[2]), sys.argv[3] == '1'
spec = {{'image': tf.io.FixedLenFeature([], tf.string),
         'label': tf.io.FixedLenFeature([], tf.int64)}}
dataset = tfrecord.TFRecordSource(pattern, spec).train_dataset(
    tf.distribute.InputContext(), per_replica_batch_size=2, seed=0,
    decode=lambda features, seed: features['label'])
if symbolic:
  options = tf.data.Options()
  options.experimental_symbolic_checkpoint = True
  dataset = dataset.with_options(options)
rng = random.Random(seed)
for _ in range({rounds}):
  iterator = iter(dataset)
  for _ in range(rng.randrange(1, 60)):  # Epochs of 24 batches.
    next(iterator)
  del iterator
print('dropped {rounds}')
'''


@pytest.mark.slow
def test_dropping_iterators_mid_read_does_not_crash(tmp_path):
  """The same loop with a symbolic checkpoint (argument 3: 1) segfaulted
  in 5 of 5 runs on TF 2.21, in the parallel interleave."""
  pattern = _write_files(tmp_path)
  seed = int.from_bytes(os.urandom(2), 'big')
  print(f'seed {seed}')
  run = subprocess.run(
      [sys.executable, '-c', _DROPPED_ITERATORS.format(rounds=40), pattern,
       str(seed), '0'], capture_output=True, text=True, timeout=300,
      cwd=helpers.REPO, env=helpers.env_with())
  assert (run.returncode, run.stdout.strip()) == (0, 'dropped 40'), (
      run.returncode, run.stderr[-3000:])


def test_augmentation_draws_anew_each_epoch(tmp_path):
  pattern = _write_files(tmp_path)
  batches = list(_train(pattern, seed=3, epochs=2))

  def images_by_label(epoch):
    return {int(label): tuple(image.numpy()) for images, labels in epoch
            for image, label in zip(images, labels)}

  first, second = images_by_label(batches[:24]), images_by_label(batches[24:])
  assert first.keys() == second.keys()
  assert all(first[label] != second[label] for label in first)


def test_a_glob_matching_nothing_names_the_glob(tmp_path):
  _write_files(tmp_path)
  with pytest.raises(errors.CtlError, match=r"No file matches '.*/nope-\*'"):
    tfrecord.TFRecordSource(str(tmp_path / 'nope-*'), SPEC)


def test_a_missing_directory_is_named(tmp_path):
  with pytest.raises(errors.CtlError,
                     match=r'data directory .*/absent does not exist'):
    tfrecord.TFRecordSource(str(tmp_path / 'absent' / '*.tfrecord'), SPEC)


def test_a_corrupt_record_names_its_file(tmp_path):
  pattern = _write_files(tmp_path)
  path = tmp_path / 'part-2.tfrecord'
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  path.write_bytes(bytes(data))
  with pytest.raises(errors.CtlError,
                     match=r'part-2\.tfrecord is not a whole TFRecord file: '
                     r'corrupted record'):
    tfrecord.TFRecordSource(pattern, SPEC)


def test_a_truncated_file_names_its_file(tmp_path):
  pattern = _write_files(tmp_path)
  path = tmp_path / 'part-1.tfrecord'
  path.write_bytes(path.read_bytes()[:-7])
  with pytest.raises(errors.CtlError, match=r'part-1\.tfrecord is not a '
                     'whole TFRecord file'):
    tfrecord.TFRecordSource(pattern, SPEC)


@pytest.mark.parametrize('spec, message', [
    ({'image': SPEC['image'], 'digit': SPEC['label']},
     r"Feature 'digit' of the spec is not in the records of .*part-0"),
    ({'image': SPEC['image'], 'label': tf.io.FixedLenFeature([], tf.float32)},
     r"Feature 'label' of .* is a int64_list but the spec says float32"),
    ({'image': SPEC['image'], 'label': tf.io.FixedLenFeature([3], tf.int64)},
     r"Feature 'label' of .* has 1 values but the spec's shape \[3\]"),
], ids=['missing', 'dtype', 'shape'])
def test_a_spec_the_records_do_not_match_names_the_feature(tmp_path, spec,
                                                           message):
  pattern = _write_files(tmp_path)
  with pytest.raises(errors.CtlError, match=message):
    tfrecord.TFRecordSource(pattern, spec)


@pytest.mark.slow
def test_the_write_command_writes_shards_and_their_spec(tmp_path):
  output = tmp_path / 'digits'
  command = [sys.executable, '-m', 'ctl.data.write_tfrecords',
             '--dataset=digits', f'--output={output}', '--num_shards=3']
  done = subprocess.run(command, cwd=helpers.REPO, env=helpers.env_with(),
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert sorted(path.name for path in output.iterdir()) == [
      *(f'eval-0000{i}-of-00003.tfrecord' for i in range(3)),
      'features.json',
      *(f'train-0000{i}-of-00003.tfrecord' for i in range(3))]
  metadata = write_tfrecords.read_metadata(str(output))
  assert metadata['image_shape'] == [8, 8] and metadata['num_classes'] == 10
  digits = datasets.load_digits(helpers.digits().data)
  spec = tfrecord_files.spec_from_json(metadata['features'])
  train = tfrecord.TFRecordSource(str(output / 'train-*'), spec)
  assert len(train) == len(digits.train) == metadata['splits']['train'][
      'num_examples']
  # Shard i holds examples i, i + 3, ...: its first is example 1 for shard 1.
  record = next(iter(tf.data.TFRecordDataset(
      str(output / 'train-00001-of-00003.tfrecord'))))
  features = tf.io.parse_single_example(record, spec)
  np.testing.assert_array_equal(
      np.frombuffer(features['image'].numpy(), np.uint8).reshape(8, 8),
      digits.train.features[1])
  assert int(features['label']) == digits.train.labels[1]

  again = subprocess.run(command, cwd=helpers.REPO, env=helpers.env_with(),
                         capture_output=True, text=True, timeout=300)
  assert again.returncode != 0 and 'exists' in again.stderr


def test_a_second_writer_keeps_the_first_whole_copy(tmp_path):
  data = datasets.load_digits(helpers.digits().data)
  output = str(tmp_path / 'shards')
  assert write_tfrecords.write(data, output, 2, 'digits')
  stamps = helpers.file_stamps(tmp_path)
  assert not write_tfrecords.write(data, output, 2, 'digits')
  assert helpers.file_stamps(tmp_path) == stamps  # No temporary left over.


def _smoke(tmp_path, **fields):
  config = helpers.load_config_file(CONFIG, 'smoke')
  config.data.tfrecord.dir = str(tmp_path / 'shards')
  return helpers.override(config, **fields)


def test_the_smoke_config_writes_its_shards_then_trains(tmp_path):
  results = run.train_and_evaluate(_smoke(tmp_path), str(tmp_path / 'work'))
  assert (tmp_path / 'shards' / 'features.json').exists()
  assert results['step'] == 2 * 44  # 1438 // 32 steps an epoch.
  assert results['eval']['accuracy'] > 0.85
  # In one global order the position is the step: no data position saved.
  assert not (tmp_path / 'work' / 'checkpoints' / 'data').exists()


@pytest.mark.parametrize('fields, message', [
    ({'data.tfrecord.prepare': False}, r'data directory .*shards .*does not '
     'exist'),
    ({'data.tfrecord.train_pattern': 'trian-*'}, r"No file matches '.*trian"),
    ({'data.tfrecord.order': 'random'}, r"config.data.tfrecord.order='random'"
     r": use 'global' .* or 'by_file'"),
], ids=['missing_directory', 'bad_glob', 'bad_order'])
def test_bad_input_stops_the_task_before_anything_is_written(
    tmp_path, fields, message):
  with pytest.raises(errors.CtlError, match=message):
    run.train_and_evaluate(_smoke(tmp_path, **fields), str(tmp_path / 'work'))
  assert not (tmp_path / 'work').exists()


def _shards(tmp_path):
  """The digits as 2 shards per split, written as the config writes them."""
  write_tfrecords.write(datasets.load_digits(helpers.digits().data),
                        str(tmp_path / 'shards'), 2, 'digits')
  return tmp_path / 'shards' / 'train-00001-of-00002.tfrecord'


def test_a_shard_corrupted_in_place_stops_training_at_its_record_naming_it(
    tmp_path):
  # Its size is what features.json recorded: it is not read through at
  # start (so a large dataset starts at once), but at its bad record.
  path = _shards(tmp_path)
  data = bytearray(path.read_bytes())
  data[1000] ^= 0xFF
  path.write_bytes(bytes(data))
  with pytest.raises(errors.CtlError, match=(
      r'Training read a bad record: .*train-00001-of-00002.tfrecord is not '
      r'a whole TFRecord file: corrupted record at \d+')):
    run.train_and_evaluate(_smoke(tmp_path), str(tmp_path / 'work'))
  assert not (tmp_path / 'work' / 'results.json').exists()
  assert not list((tmp_path / 'work').glob('checkpoints/ckpt-*'))


def test_a_shard_of_another_size_is_read_through_before_anything_is_written(
    tmp_path):
  path = _shards(tmp_path)
  path.write_bytes(path.read_bytes()[:-7])
  with pytest.raises(errors.CtlError, match='train-00001-of-00002.tfrecord '
                     'is not a whole TFRecord file'):
    run.train_and_evaluate(_smoke(tmp_path), str(tmp_path / 'work'))
  assert not (tmp_path / 'work').exists()


def test_recorded_counts_are_used_only_for_files_of_the_recorded_size(
    tmp_path):
  pattern = _write_files(tmp_path)
  size = os.path.getsize(tmp_path / 'part-0.tfrecord')
  source = tfrecord.TFRecordSource(pattern, SPEC, known_counts={
      'part-0.tfrecord': {'records': 999, 'bytes': size},  # Not read.
      'part-1.tfrecord': {'records': 999, 'bytes': size + 1}})  # Counted.
  assert source.counts == [999, 12, 12, 12]


def test_an_empty_shard_counts_no_records_whatever_features_json_says(
    tmp_path, caplog):
  path = _shards(tmp_path)
  path.write_bytes(b'')
  # As a writer whose shard came out empty records it: its records, 0 bytes.
  metadata = write_tfrecords.read_metadata(str(path.parent))
  files = metadata['splits']['train']['files']
  files[path.name]['bytes'] = 0
  (path.parent / 'features.json').write_text(json.dumps(metadata))
  with caplog.at_level(logging.WARNING):
    source = tfrecord.TFRecordSource(str(path.parent / 'train-*'), SPEC,
                                     known_counts=files)
  assert f'hold no records and are left out (a writer that failed?): {path}' in caplog.text
  [other] = [name for name in files if name != path.name]
  assert len(source) == files[other]['records']


def test_a_record_that_does_not_parse_mid_file_is_named_when_read(tmp_path):
  pattern = _write_files(tmp_path)
  # Record 5 of part-2 holds its label as a float: the checks at start
  # (the first file's first record) pass; training fails at that record.
  records = list(tf.data.TFRecordDataset(str(tmp_path / 'part-2.tfrecord'))
                 .as_numpy_iterator())
  example = tf.train.Example.FromString(records[5])
  example.features.feature['label'].ClearField('int64_list')
  example.features.feature['label'].float_list.value.append(2005.0)
  records[5] = example.SerializeToString()
  with tf.io.TFRecordWriter(str(tmp_path / 'part-2.tfrecord')) as writer:
    for record in records:
      writer.write(record)
  source = tfrecord.TFRecordSource(pattern, SPEC)
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    _labels(_train(pattern, batch=4))
  error = source.explain_failure(raised.value)
  assert re.search(r"Record 5 of .*part-2\.tfrecord does not match the "
                   r"feature spec: Key: label\. +Data types don't match",
                   str(error)), error


def test_a_corrupt_record_of_a_task_s_own_pipeline_is_a_clear_error(
    tmp_path):
  graph_error = ('Graph execution error:\n\nDetected at node while/'
                 'IteratorGetNext defined at (most recent call last):\n  '
                 'File "x.py", line 13, in <module>\n\ncorrupted record at '
                 '940\n\t [[{{node while/IteratorGetNext}}]] [Op:__inference_f]')
  error = failures.data_failure(
      tf.errors.DataLossError(None, None, graph_error), sources=[])
  assert str(error).startswith(
      "Training read a corrupt record (corrupted record at 940) through the "
      "task's own pipeline")
  assert failures.data_failure(tf.errors.InvalidArgumentError(
      None, None, 'Incompatible shapes'), sources=[]) is None


TOTAL_STEPS = 88  # The smoke config: 2 epochs of 44 steps.


@pytest.mark.slow
def test_two_workers_reading_by_file_resume_bit_identically(tmp_path):
  """4 shards, 2 workers, shifted images: SIGTERM to worker 1, restart;
  each worker reading its own files, its position saved (by_file)."""
  args = (f'--config={CONFIG}:smoke', '--config.deterministic=True',
          '--config.data.tfrecord.order=by_file',
          '--config.data.tfrecord.shift=1', '--config.intervals.log_steps=1',
          f'--config.data.tfrecord.dir={tmp_path / "shards"}')

  def start(workdir):
    return [helpers.Watched(helpers.ctl_command(*args, f'--workdir={workdir}'),
                            env) for env in helpers.cluster_envs(2)]

  # Both workers write the missing shards at once: one copy wins.
  reference = start(tmp_path / 'reference')
  assert [job.wait() for job in reference] == [0, 0], (
      reference[-1].output[-3000:])
  expected = helpers.fingerprint(reference[0].output)
  assert expected == helpers.fingerprint(reference[1].output)
  assert sorted(path.name for path in tmp_path.iterdir()) == [
      'reference', 'shards']

  for attempt in range(3):
    workdir = tmp_path / f'attempt{attempt}'
    jobs = start(workdir)
    jobs[1].wait_for(r'step 50/')  # Epoch 2, step 6 of 44.
    jobs[1].process.send_signal(signal.SIGTERM)
    codes = [job.wait() for job in jobs]
    if codes == [errors.EXIT_PREEMPTED] * 2:
      break
    # On a loaded machine the job may finish before the signal takes effect.
    assert codes == [0, 0], jobs[1].output[-3000:]
  else:
    pytest.fail('The job finished before SIGTERM in all 3 attempts')
  step = int(re.search(r'Stopped by SIGTERM after step (\d+)',
                       jobs[0].output).group(1))
  assert 50 <= step < TOTAL_STEPS and step % 44
  assert len(list(workdir.glob(f'checkpoints/data/*/ckpt-{step}.index'))) == 2

  resumed = start(workdir)
  assert [job.wait() for job in resumed] == [0, 0], resumed[1].output[-3000:]
  for job in resumed:
    assert f'Training from step {step} to {TOTAL_STEPS}' in job.output
    assert helpers.fingerprint(job.output) == expected


def _global_batches(batches: tfrecord.GlobalBatches, *, num_pipelines: int,
                    num_replicas: int, first_step: int, num_steps: int):
  """[(images, labels)] of each global step from first_step: every
  pipeline's per-replica batches, put together in replica order."""
  local = num_replicas // num_pipelines
  shares = []
  for pipeline in range(num_pipelines):
    context = tf.distribute.InputContext(
        num_input_pipelines=num_pipelines, input_pipeline_id=pipeline,
        num_replicas_in_sync=num_replicas)
    dataset = batches.dataset(context, global_batch_size=12, seed=3,
                              first_step=first_step)
    shares.append(list(dataset.take(num_steps * local).as_numpy_iterator()))
  steps = []
  for step in range(num_steps):
    parts = [share[step * local + replica] for share in shares
             for replica in range(local)]
    steps.append((np.concatenate([images for images, _ in parts]),
                  np.concatenate([labels for _, labels in parts])))
  return steps


@pytest.mark.slow
def test_global_batches_are_the_same_on_any_number_of_pipelines(tmp_path):
  # 12 files of 19 records in 6 partitions of 2 files: 19 global batches
  # of 12 a pass, each 2 records of each partition.
  source = tfrecord.TFRecordSource(_write_files(tmp_path, 12, 19), SPEC)
  batches = source.global_batches(decode=_decode, shuffle_buffer=16,
                                  cycle_length=3, partitions=6)
  assert batches.steps_per_pass(12) == 19
  assert batches.worker_counts(12) == [1, 2, 3, 6]
  reference = _global_batches(batches, num_pipelines=1, num_replicas=1,
                              first_step=0, num_steps=45)
  first_pass = np.concatenate([labels for _, labels in reference[:19]])
  assert len(set(first_pass)) == 228  # No record twice in a pass.
  second_pass = np.concatenate([labels for _, labels in reference[19:38]])
  assert list(first_pass) != list(second_pass)  # Reshuffled.
  # From the start, mid-block, at a pass's last step and after it.
  for pipelines, replicas, first_step in ((2, 2, 0), (3, 3, 7), (2, 4, 18),
                                          (1, 3, 20), (6, 6, 30)):
    got = _global_batches(batches, num_pipelines=pipelines,
                          num_replicas=replicas, first_step=first_step,
                          num_steps=45 - first_step)
    for step, (images, labels) in enumerate(got, start=first_step):
      want_images, want_labels = reference[step]
      np.testing.assert_array_equal(labels, want_labels)
      np.testing.assert_array_equal(images, want_images)  # The noise too.


def test_other_numbers_of_workers_and_partitions_are_refused(tmp_path):
  source = tfrecord.TFRecordSource(_write_files(tmp_path, 12, 19), SPEC)
  batches = source.global_batches(decode=_decode, partitions=6)
  with pytest.raises(errors.ConfigError, match=(
      r'read in 6 partitions, which 4 workers cannot share .* divides 6: '
      r'1, 2, 3, 6 \(a run resumes')):
    batches.dataset(_context(0, 4), global_batch_size=12, seed=0,
                    first_step=0)
  for partitions, batch in ((5, 12), (13, 13)):  # Not dividing; > files.
    with pytest.raises(errors.ConfigError, match=(
        f'cannot be read in {partitions} partitions with a global batch of '
        f'{batch}')):
      source.global_batches(decode=_decode, partitions=partitions
                            ).steps_per_pass(batch)
  # By default, the most that divide the batch, at most one per file.
  assert source.global_batches(decode=_decode).partitions(12) == 12
  assert source.global_batches(decode=_decode).partitions(32) == 8


def _bytes_read() -> int:
  """The bytes this process has read from files so far (Linux's rchar)."""
  with open('/proc/self/io', encoding='ascii') as io:
    return int(re.search(r'rchar: (\d+)', io.read())[1])


@pytest.mark.parametrize('num_pipelines', [1, 2, 4, 8])
@pytest.mark.slow
def test_each_pipeline_reads_only_the_records_it_trains_on(tmp_path,
                                                           num_pipelines):
  """Bytes read from the files by each pipeline of a job of 40 passes,
  over the bytes of the records its replicas train on: at most 1.1 (the
  excess: tf.data's buffers and the files they open read ahead at the
  end, and a few hundred bytes read at each file opened, so records of
  2 KB). The global order of ctl
  ctl before 0.2.0 read num_pipelines times them."""
  record = tf.train.Example(features=tf.train.Features(feature={
      'image': tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[bytes(2000)])),
      'label': tf.train.Feature(int64_list=tf.train.Int64List(
          value=[2**20]))})).SerializeToString()
  for index in range(32):  # Each record of the same size: 3-byte labels.
    with tf.io.TFRecordWriter(str(tmp_path / f'part-{index:02}.tfrecord')
                              ) as writer:
      for label in range(2**20 + index * 16, 2**20 + index * 16 + 16):
        example = tf.train.Example.FromString(record)
        example.features.feature['label'].int64_list.value[0] = label
        writer.write(example.SerializeToString())
  on_disk = len(record) + 16  # Length, its CRC, the record, its CRC.
  source = tfrecord.TFRecordSource(str(tmp_path / 'part-*.tfrecord'), SPEC)
  batches = source.global_batches(
      decode=lambda features, seed: (features['image'], features['label']))
  assert batches.partitions(32) == 32 and batches.steps_per_pass(32) == 16
  steps = 40 * 16
  next(iter(batches.dataset(_context(), global_batch_size=32, seed=0,
                            first_step=0)))  # Everything imported.
  def read(pipeline):
    """The pipeline's labels, and the bytes read per byte trained on."""
    before = _bytes_read()
    labels = _labels(batches.dataset(
        _context(pipeline, num_pipelines), global_batch_size=32, seed=0,
        first_step=0).take(steps))
    return labels, (_bytes_read() - before) / (len(labels) * on_disk)

  trained = []
  for pipeline in range(num_pipelines):
    labels, ratio = read(pipeline)
    if ratio > 1.1:
      # The process's reads count other threads' too (a lazy import, the
      # last pipeline's read-ahead winding down): they only ever add, so
      # the lower of two measurements is the closer.
      ratio = min(ratio, read(pipeline)[1])
    print(f'pipeline {pipeline} of {num_pipelines}: {ratio:.3f} records '
          'read per record trained')
    assert len(labels) == steps * 32 // num_pipelines
    assert 1 <= ratio <= 1.1, (pipeline, ratio)
    trained += labels
  assert len(set(trained)) == 512  # Every record, each by one pipeline.
