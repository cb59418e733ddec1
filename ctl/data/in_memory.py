"""Examples held in memory, batched by ctl: a pure function of (seed, step).

`InMemory` holds any nest (tuple, dict) of NumPy arrays with one row per
example. For training, every input pipeline (one per worker) computes the
same sequence of global batches of example indices and keeps its replicas'
share of each. Hence:
- a run resumed at step S starts the data at step S, no state saved: no
  example repeated or skipped;
- the global batches do not depend on how many workers or replicas share
  them, so one worker and two train on the same examples.

Epoch e uses fresh permutations of the examples seeded by (seed, e, pass), cut
into global batches. The pipeline yields one element per loop of steps
(the indices of all its steps), and each step gathers its batch from the
arrays held as tensors: each element tf.data hands over costs tens of
microseconds on a CPU (BENCHMARKS.md, "Fixed costs"). An evaluation reads
no pipeline at all: each replica gathers its share of each eval batch
(`InMemory.eval_batch`).
"""

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from ctl import errors


class InMemory:
  """A nest of arrays with one row per example, and how to finish a batch.

  Args:
    arrays: e.g. `(images, labels)` or `{'tokens': ..., 'label': ...}`.
    preprocess: applied to each gathered batch inside the step (e.g. uint8
      images to scaled floats, so that the arrays stay small in memory).
  """

  def __init__(self, arrays: Any,
               preprocess: Callable[[Any], Any] | None = None):
    self.arrays = tf.nest.map_structure(np.asarray, arrays)
    self.preprocess = preprocess
    lengths = {len(array) for array in tf.nest.flatten(self.arrays)}
    if len(lengths) != 1:
      raise errors.CtlError(
          f'ctl.InMemory: the arrays have different numbers of rows '
          f'({sorted(lengths)}); each must have one row per example.')
    (self._length,) = lengths
    if not self._length:
      raise errors.CtlError('ctl.InMemory: no examples.')
    self._tensors = None

  def __len__(self) -> int:
    return self._length

  def materialize(self) -> None:
    """Holds the arrays as tensors on the CPU; call eagerly, before tracing.

    On the CPU: a step on an accelerator then receives only its batch.
    """
    if self._tensors is None:
      with tf.device('/cpu:0'):
        self._tensors = tf.nest.map_structure(tf.constant, self.arrays)

  def gather(self, rows: tf.Tensor) -> Any:
    """The batch of examples at indices `rows`, preprocessed."""
    self.materialize()
    with tf.device('/cpu:0'):
      batch = tf.nest.map_structure(lambda t: tf.gather(t, rows),
                                    self._tensors)
    return self.preprocess(batch) if self.preprocess else batch

  def eval_batches(self, global_batch_size: int) -> Iterator[tuple[int, bool]]:
    """(index, full) of each eval batch of one pass over the examples: full
    when the whole batch lies within them (every batch but the last, when
    the batch size does not divide them); see eval_rows."""
    for index in range(-(-self._length // global_batch_size)):
      yield index, (index + 1) * global_batch_size <= self._length

  def eval_batch(self, index: tf.Tensor, global_batch_size: int,
                 full: bool) -> Any:
    """This replica's share of eval batch `index` (call it in a replica
    context, after materialize()), gathered and preprocessed.

    Read without tf.data: a pass starts no iterator (an evaluation of the
    MLP benchmark's 1,000 examples took 3.3 ms with one, 1.3 ms without;
    79 and 2.3 ms on two replicas of MirroredStrategy: BENCHMARKS.md,
    "Evaluation without an iterator").

    full: as eval_batches gives it; a full batch's parts have a static
    size.
    """
    context = tf.distribute.get_replica_context()
    return self.gather(eval_rows(
        index, global_batch_size=global_batch_size,
        replica=context.replica_id_in_sync_group,
        num_replicas=context.num_replicas_in_sync,
        num_examples=self._length, full=full))


def eval_rows(index: tf.Tensor, *, global_batch_size: int, replica,
              num_replicas: int, num_examples: int, full: bool) -> tf.Tensor:
  """The example indices of replica `replica`'s share of eval batch `index`.

  Batch i holds examples [i * global_batch_size, (i + 1) * global_batch_size)
  (fewer for the last), and replica r of the job (of every worker) its
  r-th part, in order: a pass covers each example once, on any number of
  replicas, and per-example outputs gathered in replica order are in the
  examples' order. A replica past the end gets no rows (an empty batch).
  """
  per_replica = global_batch_size // num_replicas
  start = (tf.cast(index, tf.int64) * global_batch_size +
           tf.cast(replica, tf.int64) * per_replica)
  if full:
    return start + tf.range(per_replica, dtype=tf.int64)
  return tf.range(tf.minimum(start, num_examples),
                  tf.minimum(start + per_replica, num_examples))


def train_chunks(num_examples: int, *, seed: int, global_batch_size: int,
                 steps_per_epoch: int, loops,
                 context: tf.distribute.InputContext) -> tf.data.Dataset:
  """Yields, per loop, the example indices of each of its steps.

  Epoch e's examples are passes over the data, each a permutation seeded by
  (seed, the pass's number in the run), cut into global batches; the
  epoch's last pass is cut short at its last step. A loop computes only the
  passes its steps take examples from (the last of them kept for the next
  loop), so neither memory nor the time to the first step grows with the
  length of an epoch or of the run.

  Args:
    num_examples: how many examples there are.
    seed: decides the order of examples.
    global_batch_size: examples per step across all replicas.
    steps_per_epoch: steps per epoch.
    loops: a ctl.training.loop_plan.LoopPlan: the (first step, end step) of
      each loop, none across an epoch's end, computed in the pipeline one
      at a time (`as_dataset`), so a run may have any number.
    context: this input pipeline's place among the replicas.

  Returns:
    For each loop, one element per local replica: int32 indices of shape
    [steps in the loop, per-replica batch size].
  """
  per_replica = context.get_per_replica_batch_size(global_batch_size)
  local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
  share_start = context.input_pipeline_id * local_replicas * per_replica
  share_size = local_replicas * per_replica
  passes_per_epoch = -(-steps_per_epoch * global_batch_size // num_examples)

  def loop_rows(kept, bounds):
    """The loop's share of rows; kept: the last pass computed (number,
    order), to reuse."""
    kept_number, kept_order = kept
    epoch = bounds[0] // steps_per_epoch
    first, end = tf.unstack(
        (bounds - epoch * steps_per_epoch) * global_batch_size)
    first_pass = first // num_examples
    numbers = epoch * passes_per_epoch + tf.range(
        first_pass, (end - 1) // num_examples + 1)
    orders = tf.map_fn(
        lambda number: tf.cond(
            tf.equal(number, kept_number), lambda: kept_order,
            lambda: _pass_order(num_examples, seed, number)),
        numbers, fn_output_signature=tf.TensorSpec([num_examples], tf.int32))
    offset = first_pass * num_examples
    rows = tf.reshape(tf.reshape(orders, [-1])[first - offset:end - offset],
                      [-1, global_batch_size])
    return ((numbers[-1], orders[-1]),
            rows[:, share_start:share_start + share_size])

  chunks = loops.as_dataset().scan(
      (tf.constant(-1, tf.int64), tf.zeros([num_examples], tf.int32)),
      plain(loop_rows))
  if local_replicas > 1:
    chunks = _per_local_replica(chunks, local_replicas, per_replica)
  return chunks.prefetch(2)


def _pass_order(num_examples: int, seed: int, number: tf.Tensor) -> tf.Tensor:
  """Pass `number`'s order of the examples, seeded by (seed, number)."""
  return tf.random.experimental.stateless_shuffle(
      tf.range(num_examples),
      seed=tf.stack([tf.constant(seed, tf.int64), number]))


def _per_local_replica(chunks: tf.data.Dataset, local_replicas: int,
                       per_replica: int) -> tf.data.Dataset:
  """A loop's share cut into one element per local replica: a pipeline
  feeds its local replicas consecutive elements, replica r columns
  [r * b, (r + 1) * b) of the share."""
  chunks = chunks.map(plain(lambda rows: tf.transpose(
      tf.reshape(rows, [-1, local_replicas, per_replica]), [1, 0, 2])))
  return chunks.unbatch()


def plain(function):
  """Marks a tf.data function as needing no AutoGraph conversion (it costs
  tens of milliseconds of start-up per function)."""
  return tf.autograph.experimental.do_not_convert(function)
