"""Training and eval data from TFRecord files of tf.train.Example records.

    source = tfrecord.TFRecordSource('/data/digits/train-*.tfrecord', {
        'image': tf.io.FixedLenFeature([], tf.string),
        'label': tf.io.FixedLenFeature([], tf.int64)})
    dataset = source.train_dataset(context, per_replica_batch_size=16,
                                   seed=config.seed, decode=decode)

    # Or, to resume on any number of workers (the built-in tasks' default):
    data = source.global_batches(decode=decode)

Two orders. `global_batches` (GlobalBatches, ctl/data/global_batches.py): one order of records
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

from collections.abc import Mapping, Sequence

from absl import logging
import tensorflow as tf

from ctl import errors
from ctl.data import augment
from ctl.data import global_batches as global_batches_lib
from ctl.data import in_memory
from ctl.data import tfrecord_files

FeatureSpec = tfrecord_files.FeatureSpec
Decode = global_batches_lib.Decode
# Its own module (ctl/data/global_batches.py); also named here.
GlobalBatches = global_batches_lib.GlobalBatches


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
      return _shuffled_in_blocks(records, shuffle_buffer, seed, epoch).take(
          num_records).enumerate().map(
              in_memory.plain(lambda index, record: (epoch, index, record)))

    def parse_and_decode(epoch, index, record):
      features = tf.io.parse_single_example(record, self.spec)
      return decode(features, augment.seeds(seed, epoch, index))

    examples = tf.data.Dataset.counter().flat_map(
        in_memory.plain(one_epoch)).map(
            in_memory.plain(parse_and_decode),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    # Not a symbolic checkpoint, though smaller: with one, dropping the
    # iterator can segfault in TF's parallel interleave (module docstring).
    return examples.batch(per_replica_batch_size, drop_remainder=True
                          ).prefetch(tf.data.AUTOTUNE)

  def global_batches(self, *, decode: Decode, shuffle_buffer: int = 1024,
                     cycle_length: int = 4, partitions: int = 0
                     ) -> GlobalBatches:
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


def _shuffled_in_blocks(records: tf.data.Dataset, block_size: int,
                        seed: int, epoch: tf.Tensor) -> tf.data.Dataset:
  """The records, each block of block_size permuted by (seed, epoch, block).

  Stateless seeds, not a ShuffleDataset: one seeded per epoch inside
  flat_map holds a seed generator whose state cannot be saved.
  """
  blocks = records.batch(block_size).enumerate().map(
      in_memory.plain(lambda block, block_records: tf.gather(
          block_records, tf.random.experimental.stateless_shuffle(
              tf.range(tf.shape(block_records)[0]),
              seed=augment.seeds(seed, epoch, block)))))
  return blocks.unbatch()


def _pipeline_records(counts: Sequence[int], num_pipelines: int,
                      pipeline: int) -> int:
  """The records one pipeline reads, sharded as _pipeline_files does."""
  if len(counts) >= num_pipelines:
    return sum(counts[pipeline::num_pipelines])
  total = sum(counts)  # Every num_pipelines-th record, from `pipeline` on.
  return (total - pipeline + num_pipelines - 1) // num_pipelines


def _local_replicas(context: tf.distribute.InputContext) -> int:
  return max(1, context.num_replicas_in_sync // context.num_input_pipelines)
