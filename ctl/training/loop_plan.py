"""Where loops of steps end: at every step where some action is due by its
step or epoch count (ctl/actions.py), so that it runs between
loops, after at most steps_per_loop steps."""

from collections.abc import Iterator
import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class LoopPlan:
  """The (first step, end step) of each loop of steps from `start` to
  `total_steps`.

  A loop ends at every epoch end and at every multiple of each of `every`
  (the steps where some periodic work is due), after at most
  steps_per_loop steps. The first is one step: it traces the functions,
  and its end times the start-up exactly.

  The loops are computed one at a time, as they are needed: in Python by
  iterating the plan (the training loop), in a tf.data pipeline by
  `as_dataset` (in-memory data). Nothing is computed for a whole epoch or
  run, so a run of a billion epochs, or of epochs of a trillion steps,
  starts as fast and in as little memory as a short one.
  """

  start: int
  total_steps: int
  steps_per_epoch: int
  steps_per_loop: int
  every: tuple[int, ...] = ()

  def __iter__(self) -> Iterator[tuple[int, int]]:
    step = self.start
    while step < self.total_steps:
      end = step + 1 if step == self.start else self._next_end(step, min)
      yield step, end
      step = end

  def _next_end(self, step, minimum):
    """Where a loop that starts at `step` (not the first) ends; `minimum`:
    min in Python, its tensor form in a graph."""
    return minimum(step + self.steps_per_loop, self.total_steps,
                   *((step // every + 1) * every
                     for every in (self.steps_per_epoch, *self.every)))

  def as_dataset(self) -> tf.data.Dataset:
    """The loops as a tf.data.Dataset of int64 [first step, end step]
    pairs: what iterating gives, each computed from the one before."""

    def next_loop(step, unused_element):
      end = tf.where(tf.equal(step, self.start), step + 1,
                     self._next_end(step, _tensor_min))
      return end, tf.stack([step, end])

    return tf.data.Dataset.from_tensors(0).repeat().scan(
        tf.constant(self.start, tf.int64), next_loop).take_while(
            lambda bounds: bounds[0] < self.total_steps)


def _tensor_min(*values) -> tf.Tensor:
  """The least of int64 scalars (tensors or Python ints)."""
  return tf.reduce_min(tf.stack([tf.cast(value, tf.int64)
                                 for value in values]))
