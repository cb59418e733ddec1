"""Training and eval data from TFRecord files of tf.train.Example records.

    source = tfrecord.TFRecordSource('/data/digits/train-*.tfrecord', {
        'image': tf.io.FixedLenFeature([], tf.string),
        'label': tf.io.FixedLenFeature([], tf.int64)})
    dataset = source.train_dataset(context, per_replica_batch_size=16,
                                   seed=config.seed, decode=decode)

    # Or, to resume on any number of workers (the built-in tasks' default):
    data = source.global_batches(decode=decode)

Two orders. `global_batches` (GlobalBatches, below): one order of records
for every worker, over fixed partitions of the files, each worker reading
only its own; its position is the step. `train_dataset`, by file:
a task's `train_data` returns that dataset (and its `train_steps_per_epoch`
says `source.steps_per_epoch(...)`); ctl checkpoints each worker's iterator,
so a stopped run resumes at the exact next batch on as many workers. What
the by-file pipeline does, and why:
- Files are sharded across input pipelines (workers) by file, so each
  reads only its own; with fewer files than pipelines every pipeline reads
  every file and keeps its share of the records (a logged warning).
- The dataset counts its own epochs (it is endless): epoch e's file order,
  record order and augmentation seeds are stateless functions of (seed, e)
  and the record's place in the epoch, so nothing random is carried in
  state but the position itself. Records are shuffled serialized, in
  blocks, and parsed after: the saved position holds serialized records,
  not decoded examples (TF_NOTES.md: a buffer is saved whole).
- `decode` gets an int64 [2] seed per example (`ctl.data.augment.seeds` of
  seed, epoch, index) for `tf.random.stateless_*` augmentation: the same
  draws after a restart, new ones each epoch.
- Every pipeline yields the same number of batches per epoch (the fewest
  any pipeline can fill), so that workers agree on the epoch's steps.
- The position is an ordinary iterator checkpoint, with the records and
  batches buffered after each file's read position, not a symbolic one
  (`Options.experimental_symbolic_checkpoint`, smaller: 12 KB instead of
  about 45 KB for the digits config). With a symbolic one, TF 2.21 saves
  the parallel interleave's state at every record it yields, on tf.data's
  own thread, and can segfault there (`WriteElement`) when the iterator
  is dropped while that thread reads: 3 crashes in about 200 iterators
  dropped mid-epoch, and the crash of `benchmarks/bench.py`, which drops
  its iterator after timing saves (`tf_internals.
  symbolic_checkpoint_hazard`, BUILD.md).

Files are checked at start: a glob that matches nothing, a missing
directory and a feature spec that a file's first record does not match
each raise a CtlError naming them. Each file's records are counted, which
reads it through and checks its CRCs, unless the writer recorded its count
and size (`ctl.data.write_tfrecords` does, in features.json; TFDS in its
metadata) and the size is unchanged: reading a large dataset through
would take minutes at every start. A record found corrupt (or not matching
the spec) during training stops the run at that record: the source's
`explain_failure` then reads its files through to name the one at fault
(tf.data's own DataLossError names no file).
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import logging
import tensorflow as tf

from ctl import errors
from ctl.data import augment
from ctl.data import in_memory
from ctl.data import tfrecord_files

FeatureSpec = tfrecord_files.FeatureSpec
# decode(features, seed) -> an example; seed: an int64 [2] stateless seed
# for augmentation (train), or None (eval: no augmentation).
Decode = Callable[[dict[str, tf.Tensor], tf.Tensor | None], Any]


class TFRecordSource:
  """TFRecord files of tf.train.Example records, checked at construction.

  Args:
    pattern: a glob of the files (any tf.io.gfile path).
    spec: {feature name: tf.io.FixedLenFeature}, as tf.io.parse_example
      takes it.
    known_counts: {file name: {'records': N, 'bytes': size}} as the writer
      recorded them (features.json's "files"): a file of that name and size
      is not read through to count its records.

  Raises:
    CtlError: for a missing directory, no matching file, a corrupt file
      (among those read through), or a spec the first file does not match.
  """

  def __init__(self, pattern: str, spec: FeatureSpec,
               known_counts: Mapping[str, Mapping[str, int]] | None = None):
    self.pattern = pattern
    self.spec = dict(spec)
    files = tfrecord_files.find_files(pattern)
    tfrecord_files.check_spec(files[0], self.spec)
    # How many batches each pipeline can fill. Reading a file through to
    # count it also finds a corrupt one now, with its name.
    counts = [tfrecord_files.known_count(path, known_counts or {}) or
              tfrecord_files.count_records(path)
              for path in files]
    if not sum(counts):
      raise errors.CtlError(f'The files {pattern!r} hold no records.')
    # An empty file is left out, named: a pipeline given it would have less
    # data than the others, and every pipeline stops where the first does.
    empty = [path for path, count in zip(files, counts) if not count]
    if empty:
      logging.warning('%d file(s) matching %r hold no records and are left '
                      'out (a writer that failed?): %s', len(empty), pattern,
                      ', '.join(empty))
    self.files = [path for path, count in zip(files, counts) if count]
    self.counts = [count for count in counts if count]

  def explain_failure(self, error: Exception) -> errors.CtlError | None:
    """What an error that stopped training means, if it is about a record
    of these files: a DataLossError (a corrupt record), or an
    InvalidArgumentError from parsing, names no file, so the files are read
    through now, and the error names the first one that is corrupt or does
    not match the spec. ctl asks every attribute of the task that has this
    method (ctl/training/failures.py)."""
    # ParseExample's errors: "Key: label.  Data types don't match. ...",
    # "Feature: label (data type: int64) is required but could not be found."
    if not isinstance(error, tf.errors.DataLossError) and not (
        isinstance(error, tf.errors.InvalidArgumentError) and
        errors.op_reason(error).startswith(('Key: ', 'Feature: '))):
      return None
    fault = self.find_fault()
    if fault is None:
      return None
    return errors.CtlError(f'Training read a bad record: {fault} Nothing '
                           'was saved after the latest checkpoint.')

  def find_fault(self) -> errors.CtlError | None:
    """The error of the first file that is corrupt or holds a record the
    spec does not parse, read through now; None when all are whole."""
    for path in self.files:
      try:
        tfrecord_files.check_spec(path, self.spec)
        tfrecord_files.parse_records(path, self.spec)
      except errors.CtlError as error:
        return error
    return None

  def __len__(self) -> int:
    return sum(self.counts)

  def steps_per_epoch(self, context: tf.distribute.InputContext,
                      per_replica_batch_size: int) -> int:
    """Batches of local replicas' per-replica batches that every pipeline
    can fill in one epoch: the fewest over the pipelines."""
    local_replicas = _local_replicas(context)
    steps = min(
        _pipeline_records(self.counts, context.num_input_pipelines, pipeline)
        // (per_replica_batch_size * local_replicas)
        for pipeline in range(context.num_input_pipelines))
    if not steps:
      raise errors.CtlError(
          f'The files {self.pattern!r} hold {len(self)} records: too few '
          f'for one step of {per_replica_batch_size} examples per replica '
          f'on each of {context.num_replicas_in_sync} replicas.')
    return steps

  def train_dataset(self, context: tf.distribute.InputContext, *,
                    per_replica_batch_size: int, seed: int, decode: Decode,
                    shuffle_buffer: int = 1024, cycle_length: int = 4
                    ) -> tf.data.Dataset:
    """This pipeline's per-replica training batches, epoch after epoch.

    Endless: epoch e's file order, record order and augmentation seeds are
    stateless functions of (seed, e), so the dataset counts its own epochs.
    (A finite one that ctl repeats cannot tell its passes apart without
    random state carried from pass to pass, which TF 2.21 does not restore
    exactly: measured, a restored iterator drew other orders at the next
    pass.) Each epoch is steps_per_epoch() times the local replicas'
    batches: tell ctl with Task.train_steps_per_epoch.

    Args:
      context: this input pipeline's place (worker) among the others.
      per_replica_batch_size: examples per batch.
      seed: decides every epoch's orders and augmentation seeds; the same
        seed gives the same batches.
      decode: (parsed features, int64 [2] seed) -> one example; the seed is
        for `tf.random.stateless_*` augmentation, distinct per (seed,
        epoch, example).
      shuffle_buffer: records shuffled together, serialized: each block
        of this many consecutive records (read from cycle_length files at
        once) is permuted.
      cycle_length: files read at once, interleaved record by record.
    """
    files, by_element = self._pipeline_files(context)
    num_records = (self.steps_per_epoch(context, per_replica_batch_size)
                   * _local_replicas(context) * per_replica_batch_size)

    def one_epoch(epoch):
      """The epoch's records, each with (epoch, its index in the epoch)."""
      order = tf.random.experimental.stateless_shuffle(
          tf.range(len(files)), seed=augment.seeds(seed, epoch))
      records = tf.data.Dataset.from_tensor_slices(
          tf.gather(tf.constant(files), order)).interleave(
              in_memory.plain(tf.data.TFRecordDataset),
              cycle_length=min(cycle_length, len(files)), block_length=1,
              num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
      if by_element:
        records = records.shard(context.num_input_pipelines,
                                context.input_pipeline_id)
      # Blocks permuted by stateless seeds, not a ShuffleDataset: one
      # seeded per epoch inside flat_map holds a seed generator whose state
      # cannot be saved.
      blocks = records.batch(shuffle_buffer).enumerate().map(
          in_memory.plain(lambda block, block_records: tf.gather(
              block_records, tf.random.experimental.stateless_shuffle(
                  tf.range(tf.shape(block_records)[0]),
                  seed=augment.seeds(seed, epoch, block)))))
      return blocks.unbatch().take(num_records).enumerate().map(
          in_memory.plain(lambda index, record: (epoch, index, record)))

    def parse_and_decode(epoch, index, record):
      features = tf.io.parse_single_example(record, self.spec)
      return decode(features, augment.seeds(seed, epoch, index))

    examples = tf.data.Dataset.counter().flat_map(
        in_memory.plain(one_epoch)).map(
            in_memory.plain(parse_and_decode),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    # Not a symbolic checkpoint (experimental_symbolic_checkpoint), though
    # it is smaller: with it, dropping the iterator can segfault in TF's
    # parallel interleave (ParallelInterleaveIterator::WriteElement; see
    # the module docstring).
    return examples.batch(per_replica_batch_size, drop_remainder=True
                          ).prefetch(tf.data.AUTOTUNE)

  def global_batches(self, *, decode: Decode, shuffle_buffer: int = 1024,
                     cycle_length: int = 4, partitions: int = 0
                     ) -> 'GlobalBatches':
    """These records as training data in one global order, which a task's
    train_data returns instead of a dataset: its position is the step, so
    a run resumes on any number of workers that divides the partitions
    (see GlobalBatches).

    Args:
      decode: as for train_dataset; its seed is one of (seed, epoch,
        the record's place in the epoch), whichever worker reads it.
      shuffle_buffer: records shuffled together, over all partitions: each
        block of shuffle_buffer // partitions consecutive records of a
        partition is permuted (so a worker holds at most shuffle_buffer).
      cycle_length: files of a partition read ahead at once (their order
        is kept).
      partitions: how many partitions the files are dealt into, each read
        by one worker: the numbers of workers that divide it can run (and
        resume) the job. 0: the most that divide the global batch, at most
        one per file.
    """
    return GlobalBatches(self, decode, shuffle_buffer=shuffle_buffer,
                         cycle_length=cycle_length, partitions=partitions)

  def eval_dataset(self, context: tf.distribute.InputContext, *,
                   per_replica_batch_size: int, decode: Decode
                   ) -> tf.data.Dataset:
    """One pass over this pipeline's share of the records, in file order.

    The pipelines' shares add up to every record once; the last batch may
    be partial. decode gets None for its seed.
    """
    files, by_element = self._pipeline_files(context)
    records = tf.data.TFRecordDataset(files)
    if by_element:
      records = records.shard(context.num_input_pipelines,
                              context.input_pipeline_id)
    examples = records.map(
        in_memory.plain(lambda record: decode(
            tf.io.parse_single_example(record, self.spec), None)),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return examples.batch(per_replica_batch_size).prefetch(tf.data.AUTOTUNE)

  def _pipeline_files(self, context: tf.distribute.InputContext
                      ) -> tuple[list[str], bool]:
    """This pipeline's files, and whether it must shard them by record."""
    num_pipelines = context.num_input_pipelines
    if len(self.files) >= num_pipelines:
      return self.files[context.input_pipeline_id::num_pipelines], False
    logging.warning(
        '%d TFRecord file(s) (%s) for %d input pipelines: every pipeline '
        'reads every file and keeps 1 record in %d. Write at least as many '
        'files as workers so that each reads only its own.', len(self.files),
        self.pattern, num_pipelines, num_pipelines)
    return self.files, True


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

  def __init__(self, source: TFRecordSource, decode: Decode, *,
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

    def parse_and_decode(epoch, index, record):
      features = tf.io.parse_single_example(record, self.source.spec)
      return self._decode(features, augment.seeds(seed, epoch, index))

    examples = tf.data.Dataset.range(first_epoch, tf.int64.max).flat_map(
        in_memory.plain(one_epoch)).map(
            in_memory.plain(parse_and_decode),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return examples.batch(
        context.get_per_replica_batch_size(global_batch_size),
        drop_remainder=True).prefetch(tf.data.AUTOTUNE)


class _PartitionReading:
  """How one partition's records of an epoch are read: its files in the
  epoch's drawn order, one after the other, blocks permuted."""

  def __init__(self, source: TFRecordSource, partition_of: Sequence[int], *,
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


def _pipeline_records(counts: Sequence[int], num_pipelines: int,
                      pipeline: int) -> int:
  """The records one pipeline reads, sharded as _pipeline_files does."""
  if len(counts) >= num_pipelines:
    return sum(counts[pipeline::num_pipelines])
  total = sum(counts)  # Every num_pipelines-th record, from `pipeline` on.
  return (total - pipeline + num_pipelines - 1) // num_pipelines


def _local_replicas(context: tf.distribute.InputContext) -> int:
  return max(1, context.num_replicas_in_sync // context.num_input_pipelines)
