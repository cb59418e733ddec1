"""tf.data pipelines whose batches are a pure function of (seed, step).

Every input pipeline (one per worker) computes the same sequence of global
batches of example indices and gathers only its own share of each. Hence:
- a run resumed at step S starts the data at step S: no example repeated or
  skipped, although tf.data iterators cannot be checkpointed under
  tf.distribute (TensorFlow issue 56372);
- the global batches do not depend on how many workers or replicas share
  them, so one worker and two workers train on the same examples.

Epoch e of training uses fresh permutations of the training split, seeded by
(seed, e); its steps_per_epoch * global_batch_size indices are cut into
global batches.
"""

import tensorflow as tf

from ctl import datasets


def train_dataset(split: datasets.Split, *, feature_scale: float, seed: int,
                  global_batch_size: int, steps_per_epoch: int,
                  start_step: int, total_steps: int,
                  context: tf.distribute.InputContext) -> tf.data.Dataset:
  """Returns this pipeline's per-replica (features, labels) batches.

  The dataset starts at global step start_step and ends after total_steps.
  """
  start_epoch, start_step_in_epoch = divmod(start_step, steps_per_epoch)
  end_epoch = -(-total_steps // steps_per_epoch)
  num_examples = len(split)
  passes_per_epoch = -(-steps_per_epoch * global_batch_size // num_examples)

  def epoch_batches(epoch):
    orders = [
        tf.random.experimental.stateless_shuffle(
            tf.range(num_examples),
            seed=tf.stack([tf.constant(seed, tf.int64),
                           epoch * passes_per_epoch + one_pass]))
        for one_pass in range(passes_per_epoch)
    ]
    order = tf.concat(orders, axis=0)[:steps_per_epoch * global_batch_size]
    return tf.data.Dataset.from_tensor_slices(
        tf.reshape(order, [steps_per_epoch, global_batch_size]))

  indices = tf.data.Dataset.range(start_epoch, end_epoch).flat_map(
      epoch_batches).skip(start_step_in_epoch).take(total_steps - start_step)
  indices = _take_share(indices, global_batch_size, context)
  features, labels = _as_tensors(split)

  def gather(rows):
    return (_scaled(tf.gather(features, rows), feature_scale),
            tf.gather(labels, rows))

  return indices.map(gather).prefetch(tf.data.AUTOTUNE)


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
  rows = tf.where(is_real, positions, 0)
  batches = tf.data.Dataset.from_tensor_slices(
      (tf.reshape(rows, [num_steps, global_batch_size]),
       tf.reshape(tf.cast(is_real, tf.float32),
                  [num_steps, global_batch_size])))
  batches = _take_share(batches, global_batch_size, context)
  features, labels = _as_tensors(split)

  def gather(rows, weights):
    return (_scaled(tf.gather(features, rows), feature_scale),
            tf.gather(labels, rows), weights)

  return batches.map(gather).repeat().prefetch(tf.data.AUTOTUNE)


def _take_share(batches: tf.data.Dataset, global_batch_size: int,
                context: tf.distribute.InputContext) -> tf.data.Dataset:
  """Keeps this pipeline's slice of each global batch, one element a replica.

  Replica r of the whole job gets rows [r * b, (r + 1) * b) of every global
  batch, b being the per-replica batch size. A pipeline feeds its local
  replicas consecutive elements, so it yields its replicas' slices in order.
  """
  per_replica = context.get_per_replica_batch_size(global_batch_size)
  local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
  start = context.input_pipeline_id * local_replicas * per_replica
  if local_replicas == 1:
    return batches.map(lambda *batch: tf.nest.map_structure(
        lambda rows: rows[start:start + per_replica], batch))
  return batches.map(lambda *batch: tf.nest.map_structure(
      lambda rows: tf.reshape(rows[start:start + local_replicas * per_replica],
                              [local_replicas, per_replica]),
      batch)).unbatch()


def _as_tensors(split: datasets.Split) -> tuple[tf.Tensor, tf.Tensor]:
  return tf.constant(split.features), tf.constant(split.labels)


def _scaled(features: tf.Tensor, scale: float) -> tf.Tensor:
  features = tf.cast(features, tf.float32)
  return features if scale == 1 else features * scale
