"""tf.data pipelines whose batches are a pure function of (seed, step).

Every input pipeline (one per worker) computes the same sequence of global
batches of example indices and keeps only its own share of each. Hence:
- a run resumed at step S starts the data at step S: no example repeated or
  skipped, although tf.data iterators cannot be checkpointed under
  tf.distribute (TensorFlow issue 56372);
- the global batches do not depend on how many workers or replicas share
  them, so one worker and two workers train on the same examples.

Epoch e of training uses fresh permutations of the training split, seeded by
(seed, e); its steps_per_epoch * global_batch_size indices are cut into
global batches.

Training data is held in memory (`InMemory`) and gathered inside the step:
the pipeline yields one element per loop of steps (the example indices of
all its steps), since each element tf.data hands over costs about 40 us on
a CPU, over a quarter of a small MLP's step (BENCHMARKS.md, "Fixed costs").
"""

import itertools
from collections.abc import Sequence

import tensorflow as tf

from ctl import datasets


class InMemory:
  """A split held as tensors, from which a step gathers its batch."""

  def __init__(self, split: datasets.Split, feature_scale: float):
    # On the CPU: a step on an accelerator then receives only its batch.
    with tf.device('/cpu:0'):
      self._features = tf.constant(split.features)
      self._labels = tf.constant(split.labels)
    self._feature_scale = feature_scale

  def batch(self, rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The float32 features and the labels of examples `rows`."""
    with tf.device('/cpu:0'):
      return (_scaled(tf.gather(self._features, rows), self._feature_scale),
              tf.gather(self._labels, rows))


def train_chunks(num_examples: int, *, seed: int, global_batch_size: int,
                 steps_per_epoch: int, loops: Sequence[tuple[int, int]],
                 context: tf.distribute.InputContext) -> tf.data.Dataset:
  """Yields, per loop, the example indices of each of its steps.

  Args:
    num_examples: size of the training split.
    seed: decides the order of examples.
    global_batch_size: examples per step across all replicas.
    steps_per_epoch: steps per epoch.
    loops: the (first step, end step) of each loop, in order; none may cross
      an epoch's end.
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

  # The loops of each epoch, as offsets of steps within it.
  by_epoch = [(epoch, [(start - epoch * steps_per_epoch,
                        end - epoch * steps_per_epoch) for start, end in group])
              for epoch, group in itertools.groupby(
                  loops, key=lambda loop: loop[0] // steps_per_epoch)]
  epochs = tf.constant([epoch for epoch, _ in by_epoch], tf.int64)
  bounds = tf.ragged.constant([ranges for _, ranges in by_epoch],
                              inner_shape=(2,), dtype=tf.int64)

  def epoch_chunks(position):
    epoch = epochs[position]
    orders = [
        tf.random.experimental.stateless_shuffle(
            tf.range(num_examples),
            seed=tf.stack([tf.constant(seed, tf.int64),
                           epoch * passes_per_epoch + one_pass]))
        for one_pass in range(passes_per_epoch)
    ]
    order = tf.concat(orders, axis=0)[:steps_per_epoch * global_batch_size]
    shares = tf.reshape(order, [steps_per_epoch, global_batch_size])[
        :, share_start:share_start + share_size]
    return tf.data.Dataset.from_tensor_slices(bounds[position]).map(
        _plain(lambda bound: shares[bound[0]:bound[1]]))

  chunks = tf.data.Dataset.range(len(by_epoch)).flat_map(_plain(epoch_chunks))
  if local_replicas > 1:
    # A pipeline feeds its local replicas consecutive elements: replica r
    # gets columns [r * b, (r + 1) * b) of the share.
    chunks = chunks.map(_plain(lambda rows: tf.transpose(
        tf.reshape(rows, [-1, local_replicas, per_replica]), [1, 0, 2])))
    chunks = chunks.unbatch()
  return chunks.prefetch(2)


def num_eval_steps(num_examples: int, global_batch_size: int) -> int:
  """Steps that cover num_examples, the last batch padded."""
  return -(-num_examples // global_batch_size)


def eval_dataset(split: datasets.Split, *, feature_scale: float,
                 global_batch_size: int,
                 context: tf.distribute.InputContext) -> tf.data.Dataset:
  """Returns this pipeline's per-replica (features, labels, weights) batches.

  One pass is num_eval_steps() global batches covering every example once;
  padding examples have weight 0. The dataset repeats, so one iterator
  serves every evaluation.
  """
  num_examples = len(split)
  num_steps = num_eval_steps(num_examples, global_batch_size)
  positions = tf.range(num_steps * global_batch_size)
  is_real = positions < num_examples
  batches = tf.data.Dataset.from_tensor_slices(
      (tf.reshape(tf.where(is_real, positions, 0),
                  [num_steps, global_batch_size]),
       tf.reshape(tf.cast(is_real, tf.float32),
                  [num_steps, global_batch_size])))
  per_replica = context.get_per_replica_batch_size(global_batch_size)
  local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
  start = context.input_pipeline_id * local_replicas * per_replica
  batches = batches.map(_plain(lambda rows, weights: tuple(
      tf.reshape(column[start:start + local_replicas * per_replica],
                 [local_replicas, per_replica])
      for column in (rows, weights)))).unbatch()
  data = InMemory(split, feature_scale)

  def gather(rows, weights):
    return (*data.batch(rows), weights)

  return batches.map(_plain(gather)).repeat().prefetch(tf.data.AUTOTUNE)


def _plain(function):
  """Marks a tf.data function as needing no AutoGraph conversion (it costs
  tens of milliseconds of start-up per function)."""
  return tf.autograph.experimental.do_not_convert(function)


def _scaled(features: tf.Tensor, scale: float) -> tf.Tensor:
  features = tf.cast(features, tf.float32)
  return features if scale == 1 else features * scale
