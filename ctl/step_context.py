"""What a task's step gets from ctl: `ctx`, the step context.

`train_step(self, batch, ctx)` and `eval_step(self, batch, ctx)` receive a
StepContext: the global batch size, the step, a stateless seed, the
replicas, and the ways to sum and apply gradients that the run's config
and optimizer need (`ctx.apply`), so that a step holds no policy of ctl's.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from ctl.runtime import tf_internals


class StepContext:
  """What a step needs from ctl, without reaching into it.

  Attributes:
    global_batch_size: examples per step over every replica of every worker,
      for `tf.nn.compute_average_loss(..., global_batch_size=...)`.
    step: int64 scalar: the steps finished before this one (0 first).
    seed: int64 [2]: a stateless random seed, distinct for each (config.seed,
      step, replica); for `tf.random.stateless_*` ops and Keras layers' seeds.
    replica_id: this replica's number among num_replicas.
    num_replicas: replicas in sync, over every worker.
    training: True in train_step, False in eval_step.
    accumulate_steps: micro-batches per update (config.accumulate_steps),
      for `accumulate`.
    accumulated: whether the step called `accumulate` (ctl checks that one
      does when accumulate_steps > 1).
  """

  def __init__(self, *, global_batch_size: int, step: tf.Tensor, seed: int,
               training: bool, all_reduce_dtype: str = 'float32',
               accumulate_steps: int = 1):
    self.global_batch_size = global_batch_size
    self.training = training
    self.accumulate_steps = accumulate_steps
    self.accumulated = False  # Whether the step called accumulate.
    self._step = step
    self._seed = seed
    self._all_reduce_dtype = tf.as_dtype(all_reduce_dtype)

  # Computed when a step reads them: ops a step does not use cost nothing.
  @property
  def step(self) -> tf.Tensor:
    return tf.cast(self._step, tf.int64)

  @property
  def num_replicas(self) -> int:
    return tf.distribute.get_replica_context().num_replicas_in_sync

  @property
  def replica_id(self):
    return tf.distribute.get_replica_context().replica_id_in_sync_group

  @property
  def seed(self) -> tf.Tensor:
    return tf.stack([
        tf.constant(self._seed, tf.int64),
        self.step * self.num_replicas + tf.cast(self.replica_id, tf.int64)])

  def all_reduce_sum(self, values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Sums tensors (gradients) over every replica of every worker.

    Sent in config.distribution.all_reduce_dtype, returned in their own.
    """
    values = list(values)
    if self.num_replicas == 1:
      return values
    sent = [tf.cast(value, self._all_reduce_dtype) for value in values]
    summed = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, sent)
    return [tf.cast(total, value.dtype) for total, value in zip(summed, values)]

  def apply_reduced_gradients(
      self, optimizer: keras.optimizers.Optimizer,
      grads_and_vars: Iterable[tuple[tf.Tensor, tf.Variable]]) -> None:
    """Applies gradients already summed by all_reduce_sum, as they are.

    `optimizer.apply_gradients` would sum them over the replicas again:
    Keras 3 optimizers all-reduce in replica context.
    """
    with tf_internals.keras_gradients_already_reduced(optimizer):
      optimizer.apply_gradients(grads_and_vars)

  def apply_gradients(
      self, optimizer: keras.optimizers.Optimizer,
      grads_and_vars: Iterable[tuple[tf.Tensor, tf.Variable]]) -> None:
    """Sums gradients over every replica once, then applies the sum.

    `optimizer.apply_gradients` does the same, except with a
    keras.optimizers.LossScaleOptimizer (mixed_float16): Keras checks
    whether the gradients are finite before summing them, on one replica's
    own (see BUILD.md, "Mixed precision"), so an overflow on another
    replica reaches the weights as inf or NaN. Here every replica and
    worker checks the same sum: an overflowing step is skipped everywhere
    and the loss scale halves.
    """
    gradients, variables = zip(*grads_and_vars)
    self.apply_reduced_gradients(
        optimizer, zip(self.all_reduce_sum(gradients), variables))

  def apply(self, optimizer: keras.optimizers.Optimizer,
            grads_and_vars: Iterable[tuple[tf.Tensor, tf.Variable]]) -> None:
    """Sums gradients over every replica and applies them, as this run needs.

    Keras's own sum (`optimizer.apply_gradients`) in float32; otherwise
    `apply_gradients`: the sum first, for a
    keras.optimizers.LossScaleOptimizer to check (see there) or to send in
    a 16-bit config.distribution.all_reduce_dtype. The built-in tasks call
    it; so may any step.
    """
    if (self._all_reduce_dtype == tf.float32 and
        not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
      # Keras 3 optimizers sum gradients over the replicas themselves.
      optimizer.apply_gradients(grads_and_vars)
    else:
      self.apply_gradients(optimizer, grads_and_vars)

  def accumulate(self, compute: Callable[[Any], tuple[Any, Mapping]],
                 batch: Any) -> tuple[Any, dict[str, tf.Tensor]]:
    """Gradient accumulation: `compute` on accumulate_steps micro-batches.

    Splits this replica's batch into `accumulate_steps` equal micro-batches
    along its first axis and calls `compute(micro_batch) -> (gradients,
    logs)` on each in turn (a graph loop: one micro-batch's activations in
    memory at a time). Returns the gradients summed over the micro-batches
    and the logs averaged over them. With a loss averaged over
    `global_batch_size` (tf.nn.compute_average_loss), as ever, the sum is
    the gradient of the whole batch; divide a term counted once per update
    (a regularization loss) by accumulate_steps. Apply the sum once
    (`ctx.apply_gradients`): one optimizer step, one all-reduce.
    """
    self.accumulated = True
    if self.accumulate_steps == 1:
      return compute(batch)
    parts = self.accumulate_steps
    micro_batches = tf.nest.map_structure(
        lambda tensor: _split_rows(tensor, parts), batch)
    micro_batch = lambda i: tf.nest.map_structure(lambda t: t[i],
                                                  micro_batches)
    # The first outside the loop: it gives the sums their structure.
    first_gradients, first_logs = compute(micro_batch(0))
    flat = tf.nest.flatten(first_gradients)
    present = [i for i, gradient in enumerate(flat) if gradient is not None]

    def summable(gradients, logs):
      # Dense (an embedding's IndexedSlices too); None stays None.
      flat = tf.nest.flatten(gradients)
      return ([tf.convert_to_tensor(flat[i]) for i in present],
              {name: tf.cast(value, tf.float32) for name, value in logs.items()})

    def body(i, sums, log_sums):
      gradients, logs = summable(*compute(micro_batch(i)))
      return (i + 1, [a + b for a, b in zip(sums, gradients)],
              {name: log_sums[name] + logs[name] for name in log_sums})

    _, sums, log_sums = tf.while_loop(
        lambda i, *_: i < parts, body,
        [tf.constant(1), *summable(first_gradients, first_logs)],
        parallel_iterations=1)
    for i, total in zip(present, sums):
      flat[i] = total
    gradients = tf.nest.pack_sequence_as(first_gradients, flat)
    return gradients, {name: value / parts for name, value in log_sums.items()}


def _split_rows(tensor: tf.Tensor, parts: int) -> tf.Tensor:
  """[rows, ...] -> [parts, rows / parts, ...], static shapes kept (XLA)."""
  tensor = tf.convert_to_tensor(tensor)
  if tensor.shape.is_fully_defined():
    return tf.reshape(tensor, [parts, tensor.shape[0] // parts,
                               *tensor.shape[1:]])
  return tf.reshape(
      tensor, tf.concat([[parts, -1], tf.shape(tensor)[1:]], axis=0))
