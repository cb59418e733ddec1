"""A source's records in one global order, cut into global batches.

`TFRecordSource.global_batches(decode=...)` (ctl/data/tfrecord.py, and
ctl/data/tfds.py's TFDSSource) makes one: a task's train_data returns it,
and ctl reads it through `ctl.data.inputs.GlobalOrderInput`. Its position
is the step, so a run resumes on any number of workers that divides its
partitions. Importing this module imports no TFRecord source code: a run
whose task does not read files never loads ctl/data/tfrecord.py.
"""

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from absl import logging
import tensorflow as tf

from ctl import errors
from ctl.data import augment
from ctl.data import in_memory

# decode(features, seed) -> an example; seed: an int64 [2] stateless seed
# for augmentation (train), or None (eval: no augmentation).
Decode = Callable[[dict[str, tf.Tensor], tf.Tensor | None], Any]


class Records(Protocol):
  """What GlobalBatches reads of its source (a ctl.TFRecordSource)."""

  pattern: str  # The files' glob, for messages.
  spec: dict[str, Any]  # {feature: tf.io.FixedLenFeature}.
  files: list[str]  # Each file, none empty.
  counts: list[int]  # Each file's records.

  def __len__(self) -> int:
    """Records over all files."""


class GlobalBatches:
  """A source's records in one global order over a fixed set of partitions,
  cut into global batches.

  The files are dealt once into `partitions(G)` partitions of about equal
  records (the largest file to the partition with the fewest records so
  far). Global batch b of a global batch of G holds G / P records of each
  of the P partitions, partition p's in columns [p * G / P, (p + 1) * G / P):
  its records [b * G / P, (b + 1) * G / P) of the data's epoch. A
  partition's records in epoch e are its files in the order of one draw
  of all files from (seed, e), read one after the other, each block of
  max(1, shuffle_buffer // P) records permuted by (seed, e, block, p). The
  global batches are the same on any number N of workers that divides P:
  worker w reads only partitions [w * P / N, (w + 1) * P / N), the records
  its replicas train on, and nothing else (plus the files' read-ahead).
  The position is the step: at step s each partition starts at its record
  (s mod steps_per_pass) * G / P, seeking to the file that holds that
  record's block (the files' record counts say which) and skipping that
  file's records before it. Nothing is saved, so a run stopped on N
  workers resumes exactly on any M that divides P.

  With one partition it is the order of ctl before 0.2.0, in which every worker
  read every record (a workdir of it resumes with partitions=1, on one
  worker).
  """

  def __init__(self, source: Records, decode: Decode, *,
               shuffle_buffer: int, cycle_length: int, partitions: int = 0):
    if shuffle_buffer < 1 or cycle_length < 1 or partitions < 0:
      raise errors.ConfigError(
          f'shuffle_buffer={shuffle_buffer} and cycle_length={cycle_length} '
          f'must each be at least 1, and partitions={partitions} at least 0 '
          '(0: as many as the files and the batch allow).')
    self.source = source
    self._decode = decode
    self._shuffle_buffer = shuffle_buffer
    self._cycle_length = cycle_length
    self._partitions = partitions

  def partitions(self, global_batch_size: int) -> int:
    """How many partitions the records are read in: as asked, or else the
    most that divide the global batch, at most one per file.

    Raises:
      ConfigError: more partitions than files, or a global batch that does
        not divide into them.
    """
    num_files = len(self.source.files)
    count = self._partitions or max(
        count for count in range(1, min(num_files, global_batch_size) + 1)
        if global_batch_size % count == 0)
    if count > num_files or global_batch_size % count:
      raise errors.ConfigError(
          f'The records of {self.source.pattern!r} cannot be read in '
          f'{count} partitions with a global batch of {global_batch_size}: '
          f'each partition reads whole files ({num_files} here) and gives '
          'each global batch as many records as the others. Ask for a '
          f'number of partitions that divides the batch, at most {num_files} '
          '(or 0: the most that do), or write more files.')
    return count

  def worker_counts(self, global_batch_size: int) -> list[int]:
    """The numbers of workers that can read these batches (and resume
    them): those that divide the partitions."""
    count = self.partitions(global_batch_size)
    return [workers for workers in range(1, count + 1)
            if count % workers == 0]

  def check_workers(self, num_workers: int, global_batch_size: int) -> None:
    """Raises ConfigError, naming the counts that work, if num_workers
    cannot each read their own partitions."""
    counts = self.worker_counts(global_batch_size)
    if num_workers not in counts:
      raise errors.ConfigError(
          f'The records of {self.source.pattern!r} are read in {counts[-1]} '
          f'partitions, which {num_workers} workers cannot share (each reads '
          'only its own partitions). Run on a number of workers that divides '
          f'{counts[-1]}: {", ".join(map(str, counts))} (a run resumes on any '
          'of them with the same global batches). Nothing was written.')

  def _loads(self, count: int) -> tuple[list[int], list[int]]:
    """Each file's partition (the largest file first to the partition with
    the fewest records), and each partition's records."""
    loads = [0] * count
    partition_of = [0] * len(self.source.counts)
    for index in sorted(range(len(self.source.counts)),
                        key=lambda index: (-self.source.counts[index], index)):
      partition = min(range(count), key=lambda p: (loads[p], p))
      partition_of[index] = partition
      loads[partition] += self.source.counts[index]
    return partition_of, loads

  def steps_per_pass(self, global_batch_size: int) -> int:
    """Global batches in one pass over the records (ctl's epoch, unless
    config.steps_per_epoch says otherwise): as many as the partition with
    the fewest records fills.

    Raises:
      CtlError: too few records for one global batch.
    """
    count = self.partitions(global_batch_size)
    _, loads = self._loads(count)
    steps = min(loads) // (global_batch_size // count)
    if not steps:
      raise errors.CtlError(
          f'The files {self.source.pattern!r} hold {len(self.source)} '
          f'records in {count} partitions (the fewest {min(loads)}): too few '
          f'for one global batch of {global_batch_size}.')
    left_out = len(self.source) - steps * global_batch_size
    if left_out > len(self.source) // 10:
      logging.warning(
          '%d of the %d records of %r are left out of each pass: their %d '
          'partitions hold %s records (whole files each). Files of more '
          'even sizes, or fewer partitions, leave fewer out.', left_out,
          len(self.source), self.source.pattern, count, loads)
    return steps

  def dataset(self, context: tf.distribute.InputContext, *,
              global_batch_size: int, seed: int,
              first_step: int) -> tf.data.Dataset:
    """This worker's per-replica batches from global step first_step on,
    endless: its local replicas' shares of each global batch (its own
    partitions' records), one replica after the other. Pass after pass
    over the records, each of steps_per_pass() global batches.

    Raises:
      ConfigError: for a number of workers that does not divide the
        partitions.
    """
    self.check_workers(context.num_input_pipelines, global_batch_size)
    count = self.partitions(global_batch_size)
    per_partition = global_batch_size // count  # Records in each batch.
    owned = count // context.num_input_pipelines
    steps_per_pass = self.steps_per_pass(global_batch_size)
    partition_records = steps_per_pass * per_partition
    first_epoch, first_batch = divmod(first_step, steps_per_pass)
    partition_of, _ = self._loads(count)
    reading = _PartitionReading(
        self.source, partition_of, seed=seed,
        block=max(1, self._shuffle_buffer // count),
        cycle_length=self._cycle_length)

    def partition_chunks(epoch, partition):
      """(epoch, index in the epoch, record) of one partition's records,
      in chunks of its G / P records of each global batch: per-record ops
      cost microseconds each."""
      first_batch_of_epoch = tf.where(tf.equal(epoch, first_epoch),
                                      tf.constant(first_batch, tf.int64),
                                      tf.constant(0, tf.int64))
      records = reading.records(epoch, partition,
                                first_batch_of_epoch * per_partition,
                                partition_records)
      columns = partition * per_partition + tf.range(per_partition,
                                                     dtype=tf.int64)
      return records.batch(per_partition).enumerate(
          first_batch_of_epoch).map(in_memory.plain(
              lambda batch, chunk: (
                  tf.fill([per_partition], epoch),
                  batch * global_batch_size + columns, chunk)))

    def one_epoch(epoch):
      """This worker's partitions, a chunk of each in turn. Read in this
      pipeline's thread: a thread per partition (prefetch, or a parallel
      interleave) cost 10-25% more CPU per record than by_file's pipeline
      on this 2-core machine; the prefetch at the end reads ahead."""
      first = context.input_pipeline_id * owned
      partitions = tf.data.Dataset.range(first, first + owned)
      chunks = in_memory.plain(lambda partition: partition_chunks(
          epoch, partition))
      return partitions.interleave(
          chunks, cycle_length=owned, block_length=1).unbatch()

    return self._decoded_batches(
        tf.data.Dataset.range(first_epoch, tf.int64.max).flat_map(
            in_memory.plain(one_epoch)),
        seed, context.get_per_replica_batch_size(global_batch_size))

  def _decoded_batches(self, records: tf.data.Dataset, seed: int,
                       per_replica_batch_size: int) -> tf.data.Dataset:
    """(epoch, index, record) elements parsed, decoded and batched."""

    def parse_and_decode(epoch, index, record):
      features = tf.io.parse_single_example(record, self.source.spec)
      return self._decode(features, augment.seeds(seed, epoch, index))

    examples = records.map(
        in_memory.plain(parse_and_decode),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return examples.batch(per_replica_batch_size,
                          drop_remainder=True).prefetch(tf.data.AUTOTUNE)


class _PartitionReading:
  """How one partition's records of an epoch are read: its files in the
  epoch's drawn order, one after the other, blocks permuted."""

  def __init__(self, source: Records, partition_of: Sequence[int], *,
               seed: int, block: int, cycle_length: int):
    self._files = tf.constant(source.files)
    self._counts = tf.constant(source.counts, tf.int64)
    self._partition_of = tf.constant(partition_of, tf.int64)
    self._num_files = len(source.files)
    self._longest = max(source.counts)
    self._seed = seed
    self._block = block
    most_files = max(list(partition_of).count(p) for p in set(partition_of))
    self._cycle_length = min(cycle_length, most_files)

  def _read_from(self, epoch, partition, start):
    """The partition's records of the epoch from record `start` on (a
    block's first): its files opened from the one that holds it."""
    order = tf.random.experimental.stateless_shuffle(
        tf.range(self._num_files), seed=augment.seeds(self._seed, epoch))
    order = tf.boolean_mask(order, tf.equal(
        tf.gather(self._partition_of, order), partition))
    ordered_counts = tf.gather(self._counts, order)
    ends = tf.cumsum(ordered_counts)
    first = tf.searchsorted(ends, tf.reshape(start, [1]), side='right')[0]
    skips = tf.concat([[start - ends[first] + ordered_counts[first]],
                       tf.zeros_like(ordered_counts[first + 1:])], axis=0)
    files = tf.data.Dataset.from_tensor_slices(
        (tf.gather(self._files, order)[first:], skips))
    read = in_memory.plain(lambda name, skip: tf.data.TFRecordDataset(
        name).skip(skip))
    if self._cycle_length == 1:  # No thread handing over each record.
      return files.flat_map(read)
    # A block as long as the longest file: each file whole, in order,
    # while the next cycle_length - 1 are read ahead.
    return files.interleave(
        read, cycle_length=self._cycle_length, block_length=self._longest,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

  def records(self, epoch, partition, start, end) -> tf.data.Dataset:
    """The partition's records [start, end) of the epoch, each block of
    its records permuted by (seed, epoch, block, partition)."""
    block_start = start // self._block * self._block
    blocks = self._read_from(epoch, partition, block_start).take(
        end - block_start).batch(self._block).enumerate(
            block_start // self._block).map(in_memory.plain(
                lambda index, records: tf.gather(
                    records, tf.random.experimental.stateless_shuffle(
                        tf.range(tf.shape(records)[0]),
                        seed=augment.seeds(self._seed, epoch, index,
                                           -1 - partition)))))
    return blocks.unbatch().skip(start - block_start)
