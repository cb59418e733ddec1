"""ctl over TFRecord shards against a hand-written loop over the same files,
and what saving the data position costs (`python -m benchmarks.bench
--sections=tfrecord`).

Both contenders train configs/digits_tfrecord.py's task (the digits CNN,
Adam, 32 examples a step, no XLA) on the digits written as 4 TFRecord
shards (`write_shards`), read by the same ctl.data.tfrecord pipeline with
the config's settings, one step being the task's own `train_step`. ctl
runs with its default intervals (a user's run: the config's own save and
summaries every few steps suit a 5-second job, not a measurement) and one
epoch as long as the run, so that it evaluates only after the last step,
as the hand-written loop never does. The hand-written loop is the fair
equivalent of ctl's: a tf.function running `steps_per_loop` steps in a
tf.while_loop, each reading `next(iterator)`, the loss summed for a log
line; no metrics read, no checkpoints or summaries. Each is a fresh run
of CTL_STEPS steps in a process of its own, measured over its second half
in turns with the other (benchmarks/timeslice.py says why).

The save cost is that of ctl's own `DataPositions.save` of the training
iterator mid-epoch, as ctl writes it beside each checkpoint when the files
are read by_file (in the global order, the default, nothing is saved):
milliseconds (the training thread waits for it) and bytes on disk.

The global order against by_file (`--sections=elastic`): ctl's training
speed with each, in turns; one worker's pipeline alone, in examples per
second and records read from the files per record yielded, for 1 to 16
workers (in the global order each reads only its own partitions); how
well mixed a pass's global batches are in each order (`mixing`); and the
seconds from a restart to the first batch at the resumed step.
"""

import dataclasses
import importlib.util
import os
import pathlib
import re
import tempfile
import time
from collections.abc import Callable

import ml_collections
import numpy as np
import tensorflow as tf

from benchmarks import workloads
from benchmarks.timeslice import Progress
from ctl import config as config_lib
from ctl import task as task_lib
from ctl import task_hooks
from ctl.checkpoints import data_positions
from ctl.data import datasets
from ctl.data import inputs
from ctl.data import tfrecord
from ctl.data import write_tfrecords

CONFIG = pathlib.Path(__file__).resolve().parents[1] / 'configs' / (
    'digits_tfrecord.py')
NUM_SHARDS = 4
CTL_STEPS = 6000  # A run of about 18 s; its second half is measured.


def load_config() -> ml_collections.ConfigDict:
  """configs/digits_tfrecord.py's get_config()."""
  spec = importlib.util.spec_from_file_location('configs_digits_tfrecord',
                                                CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def write_shards(directory: str) -> None:
  """The digits as NUM_SHARDS TFRecord shards per split, in directory."""
  config = load_config()
  write_tfrecords.write(datasets.load(config.data), directory, NUM_SHARDS,
                        config.data.name)


def ctl_config(directory: str, **overrides) -> ml_collections.ConfigDict:
  """The config's task on the shards in directory, with ctl's default
  intervals and one epoch of CTL_STEPS steps; overrides are dotted keys."""
  config = load_config()
  config.data.tfrecord.dir = directory
  config.data.tfrecord.prepare = False
  config.intervals = config_lib.base_config().intervals
  config.total_steps = CTL_STEPS
  config.steps_per_epoch = CTL_STEPS
  workloads.override(config, overrides)
  config_lib.validate(config)
  return config


def ctl_progress(directory: str, **overrides) -> Callable[[], Progress]:
  """(a) ctl running the task: a function training a fresh run and returning
  its progress (benchmarks/timeslice.py)."""
  return lambda: workloads.run_progress(ctl_config(directory, **overrides))


def _task_and_data(directory: str, **overrides
                   ) -> tuple[task_lib.Task, tf.data.Dataset]:
  """The task, built, and its training pipeline for one worker, as ctl
  reads it from step 0."""
  config = ctl_config(directory, **overrides)
  task = task_hooks.resolve(config.task)(config)
  task.total_steps = config.total_steps
  dataset = task.train_data(tf.distribute.InputContext())
  if isinstance(dataset, tfrecord.GlobalBatches):
    dataset = dataset.dataset(tf.distribute.InputContext(),
                              global_batch_size=config.batch_size,
                              seed=config.seed, first_step=0)
  task.build()
  return task, dataset


def hand_loop_progress(directory: str, total_steps: int = CTL_STEPS,
                       steps_per_loop: int = 100) -> Callable[[], Progress]:
  """(b) The same pipeline and step in a hand-written loop: a function
  building it, training total_steps and returning its progress."""
  def train() -> Progress:
    task, dataset = _task_and_data(directory)
    with tf.device('/cpu:0'):  # Where ctl makes its iterator.
      iterator = iter(dataset)
    ctx = task_lib.StepContext(global_batch_size=task.config.batch_size,
                               step=tf.constant(0, tf.int64),
                               seed=task.config.seed, training=True)
    return workloads.graph_loop_progress(
        lambda batch: task.train_step(batch, ctx)['loss'], iterator,
        total_steps, steps_per_loop)

  return train


def data_position_save(directory: str, saves: int = 10,
                       steps_between: int = 50) -> tuple[list[float], int]:
  """Times ctl's save of the training iterator's position, as it saves it
  beside each checkpoint, `saves` times `steps_between` batches apart.

  Returns:
    The milliseconds of each save, and the bytes of the last one's files.
  """
  task, dataset = _task_and_data(directory, **{'data.tfrecord.order':
                                               'by_file'})
  train_input = inputs.DatasetInput(tf.distribute.get_strategy(), dataset,
                                    num_local_replicas=1)
  iterator = train_input.make_iterator([])
  milliseconds = []
  with tempfile.TemporaryDirectory() as scratch:
    positions = data_positions.DataPositions(
        train_input.checkpointable, scratch,
        max_to_keep=task.config.intervals.keep_checkpoints)
    for save in range(saves + 1):
      for _ in range(steps_between):  # Mid-epoch: an epoch is 44 batches.
        next(iterator)
      start = time.perf_counter()
      positions.save((save + 1) * steps_between)
      if save:  # The first traces the save.
        milliseconds.append((time.perf_counter() - start) * 1000)
    prefix = os.path.join(scratch, 'pipeline-0-of-1',
                          f'ckpt-{(saves + 1) * steps_between}')
    size = sum(os.path.getsize(path) for path in tf.io.gfile.glob(
        prefix + '.*'))
  return milliseconds, size


ELASTIC_SHARDS = 16
ELASTIC_COPIES = 50  # The digits 50 times over: 71,900 training records.


def write_elastic_shards(directory: str) -> None:
  """The digits, ELASTIC_COPIES times over, as ELASTIC_SHARDS shards: enough
  files for 8 workers to read their own by_file, and records enough for a
  restart to seek far into a pass."""
  config = load_config()
  data = datasets.load(config.data)
  train = datasets.Split(np.tile(data.train.features,
                                 (ELASTIC_COPIES, 1, 1)),
                         np.tile(data.train.labels, ELASTIC_COPIES))
  write_tfrecords.write(dataclasses.replace(data, train=train), directory,
                        ELASTIC_SHARDS, config.data.name)


def _worker_pipeline(directory: str, order: str, num_workers: int,
                     first_step: int = 0):
  """Worker 0's pipeline of num_workers, 32 examples per replica (one
  replica a worker), as ctl builds it: (dataset, its global batch size)."""
  batch = 32 * num_workers
  config = ctl_config(directory, batch_size=batch,
                      **{'data.tfrecord.order': order})
  task = task_hooks.resolve(config.task)(config)
  context = tf.distribute.InputContext(num_input_pipelines=num_workers,
                                       input_pipeline_id=0,
                                       num_replicas_in_sync=num_workers)
  data = task.train_data(context)
  if isinstance(data, tfrecord.GlobalBatches):
    data = data.dataset(context, global_batch_size=batch, seed=config.seed,
                        first_step=first_step)
  return data, batch


def bytes_read() -> int:
  """The bytes this process has read from files so far (Linux's rchar)."""
  with open('/proc/self/io', encoding='ascii') as io:
    return int(re.search(r'rchar: (\d+)', io.read())[1])


def pipeline_rate(directory: str, order: str, num_workers: int,
                  batches: int = 600) -> float:
  """Examples per second that one worker's pipeline yields alone, nothing
  training: how fast it reads, parses and batches its share."""
  dataset, _ = _worker_pipeline(directory, order, num_workers)
  iterator = iter(dataset)
  for _ in range(50):  # Warm: files opened, threads started.
    next(iterator)
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return 32 * batches / (time.perf_counter() - start)


def records_read(directory: str, num_workers: int, passes: int = 10
                 ) -> float:
  """Records that worker 0 of num_workers reads from the files, in the
  global order, per record it trains on, over `passes` passes from step
  0: the bytes this process read while iterating (the read-ahead
  included: each file opened reads up to 256 KB at once) over those of
  the records yielded."""
  files = tf.io.gfile.glob(os.path.join(directory, 'train-*'))
  records = ELASTIC_COPIES * 1438
  record_bytes = sum(os.path.getsize(path) for path in files) / records
  dataset, batch = _worker_pipeline(directory, 'global', num_workers)
  steps = passes * (records // batch)
  before = bytes_read()
  yielded = sum(1 for _ in dataset.take(steps)) * 32
  return (bytes_read() - before) / record_bytes / yielded


MIXING_BATCH = 256  # 8 workers of 32.
NEAR = 512  # Records: the config's shuffle buffer.


def write_id_shards(directory: str) -> str:
  """ELASTIC_SHARDS files of records holding only their position (an
  id, 0.. across the files), as many as the elastic shards; their glob."""
  per_file = ELASTIC_COPIES * 1438 // ELASTIC_SHARDS
  for index in range(ELASTIC_SHARDS):
    with tf.io.TFRecordWriter(os.path.join(
        directory, f'ids-{index:02}.tfrecord')) as writer:
      for record_id in range(index * per_file, (index + 1) * per_file):
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            'id': tf.train.Feature(int64_list=tf.train.Int64List(
                value=[record_id]))})).SerializeToString())
  return os.path.join(directory, 'ids-*.tfrecord')


def mixing(pattern: str, order: str) -> tuple[float, float]:
  """How well mixed one pass's global batches of MIXING_BATCH are, in an
  order: 'global' (ctl's, its default partitions), 'global_0.2.0' (one
  partition: ctl 0.2.0's), 'by_file' (8 workers' shares side by side),
  'full' (a uniform shuffle of the pass). Returns the mean number of
  source files in a batch (of ELASTIC_SHARDS), and the share of pairs of
  a batch's records that lie within NEAR records of each other in the
  files (a uniform shuffle: about 2 * NEAR / records)."""
  config = load_config().data.tfrecord
  source = tfrecord.TFRecordSource(
      pattern, {'id': tf.io.FixedLenFeature([], tf.int64)})
  decode = lambda features, seed: features['id']
  if order == 'full':
    ids = np.random.default_rng(0).permutation(len(source))
  elif order.startswith('global'):
    batches = source.global_batches(
        decode=decode, shuffle_buffer=config.shuffle_buffer,
        cycle_length=config.cycle_length,
        partitions=1 if order == 'global_0.2.0' else 0)
    steps = batches.steps_per_pass(MIXING_BATCH)
    ids = np.concatenate(list(batches.dataset(
        tf.distribute.InputContext(), global_batch_size=MIXING_BATCH,
        seed=0, first_step=0).take(steps).as_numpy_iterator()))
  else:
    shares = []
    for worker in range(8):
      context = tf.distribute.InputContext(8, worker, 8)
      steps = source.steps_per_epoch(context, MIXING_BATCH // 8)
      shares.append(list(source.train_dataset(
          context, per_replica_batch_size=MIXING_BATCH // 8, seed=0,
          decode=decode, shuffle_buffer=config.shuffle_buffer,
          cycle_length=config.cycle_length).take(steps).as_numpy_iterator()))
    ids = np.concatenate([np.concatenate(step) for step in zip(*shares)])
  per_file = len(source) // ELASTIC_SHARDS
  files, near = [], []
  for batch in ids[:len(ids) // MIXING_BATCH * MIXING_BATCH].reshape(
      -1, MIXING_BATCH):
    files.append(len(set(batch // per_file)))
    gaps = np.abs(batch[:, None] - batch[None, :])
    near.append(((gaps < NEAR).sum() - MIXING_BATCH) /
                (MIXING_BATCH * (MIXING_BATCH - 1)))
  return float(np.mean(files)), float(np.mean(near))


def restart_seconds(directory: str, order: str, num_workers: int = 2
                    ) -> float:
  """Seconds from building worker 0's pipeline to its first batch at the
  last step of a pass (the farthest a restart seeks), resumed as ctl
  resumes it: global, by its step; by_file, by restoring the iterator
  saved there."""
  probe, batch = _worker_pipeline(directory, order, num_workers)
  if order == 'global':
    steps = ELASTIC_COPIES * 1438 // batch
    start = time.perf_counter()
    dataset, _ = _worker_pipeline(directory, order, num_workers,
                                  first_step=steps - 1)
    next(iter(dataset))
    return time.perf_counter() - start
  iterator = iter(probe)
  steps = ELASTIC_COPIES * 1438 // 2 // batch  # by_file: its own half.
  for _ in range(steps - 1):
    next(iterator)
  with tempfile.TemporaryDirectory() as scratch:
    path = tf.train.Checkpoint(iterator=iterator).write(
        os.path.join(scratch, 'position'))
    start = time.perf_counter()
    dataset, _ = _worker_pipeline(directory, order, num_workers)
    restored = iter(dataset)
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    next(restored)
    return time.perf_counter() - start
