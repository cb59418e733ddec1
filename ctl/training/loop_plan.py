"""Where loops of steps end: at every step where some action is due by its
step or epoch count or once (ctl/actions.py), so that it runs between
loops, and at every multiple of steps_per_loop: the same steps whether a
run started at step 0 or resumed, so that every action sees the same
loops either way."""

import bisect
from collections.abc import Iterator
import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class LoopPlan:
  """The (first step, end step) of each loop of steps from `start` to
  `total_steps`.

  A loop ends at every epoch end, at every multiple of each of `every`
  (the steps where some periodic work is due), at each step of `at`
  (sorted: where some one-off work is due) and at every multiple of
  steps_per_loop. A run's first loop from step 0 is one step: it traces
  the functions, and its end times the start-up exactly. A resumed run
  (from a step where a loop ended) cuts its loops where a run from step 0
  cuts them: an action that reads each loop's logs (a rollback's recent
  mean) then decides alike whether or not the run was stopped in between.

  The loops are computed as they are needed: in Python by iterating the
  plan (the training loop), in a tf.data pipeline one epoch at a time by
  `epoch_bounds` (in-memory data). Nothing is held for the whole run, so a
  run of a billion epochs starts as fast and in as little memory as one.
  """

  start: int
  total_steps: int
  steps_per_epoch: int
  steps_per_loop: int
  every: tuple[int, ...] = ()
  at: tuple[int, ...] = ()

  def __iter__(self) -> Iterator[tuple[int, int]]:
    step = self.start
    while step < self.total_steps:
      end = 1 if step == 0 else self._next_end(step)
      yield step, end
      step = end

  def _next_end(self, step: int) -> int:
    """Where the loop from `step` (not a run's first from step 0) ends."""
    after = bisect.bisect_right(self.at, step)
    return min(self.total_steps, *self.at[after:after + 1],
               *((step // every + 1) * every for every in (
                   self.steps_per_loop, self.steps_per_epoch, *self.every)))

  def _next_one_off(self, step: tf.Tensor) -> tf.Tensor:
    """The first step of `at` after `step` (int64 scalars), or the end."""
    at = tf.constant((*self.at, self.total_steps), tf.int64)
    return tf.reduce_min(tf.where(at > step, at, at[-1]))

  def epoch_bounds(self, epoch: tf.Tensor) -> tf.Tensor:
    """The loops of epoch `epoch` (an int64 scalar), as [n, 2] int64 step
    offsets within it: what iterating gives, computed in a graph (a
    tf.data function)."""
    first = epoch * self.steps_per_epoch
    low = tf.maximum(first, self.start)
    high = tf.minimum(first + self.steps_per_epoch, self.total_steps)

    def body(step, bounds):
      end = tf.reduce_min(tf.stack([
          tf.constant(self.total_steps, tf.int64), self._next_one_off(step),
          *((step // every + 1) * every for every in (
              self.steps_per_loop, self.steps_per_epoch, *self.every))]))
      end = tf.where(tf.equal(step, 0), tf.ones_like(end), end)
      return end, bounds.write(bounds.size(), tf.stack([step, end]) - first)

    _, bounds = tf.while_loop(
        lambda step, _: step < high, body,
        [low, tf.TensorArray(tf.int64, size=0, dynamic_size=True,
                             element_shape=[2])])
    return bounds.stack()

  @property
  def epochs(self) -> tuple[int, int]:
    """The first epoch with a loop and the one after the last."""
    return (self.start // self.steps_per_epoch,
            -(-self.total_steps // self.steps_per_epoch))
