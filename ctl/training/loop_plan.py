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
  at: tuple[int, ...] = ()

  def __iter__(self) -> Iterator[tuple[int, int]]:
    step = self.start
    while step < self.total_steps:
      end = 1 if step == 0 else self._next_end(step, min,
                                               self._one_off_after)
      yield step, end
      step = end

  def _next_end(self, step, minimum, one_off_after):
    """Where a loop that starts at `step` (not a run's first from step 0)
    ends; `minimum` and `one_off_after`: in Python, or their tensor forms
    in a graph."""
    return minimum(self.total_steps, one_off_after(step),
                   *((step // every + 1) * every for every in (
                       self.steps_per_loop, self.steps_per_epoch,
                       *self.every)))

  def _one_off_after(self, step: int) -> int:
    """The first step of `at` after `step`, or the end."""
    after = bisect.bisect_right(self.at, step)
    return (*self.at[after:after + 1], self.total_steps)[0]

  def _one_off_after_in_graph(self, step: tf.Tensor) -> tf.Tensor:
    """_one_off_after of an int64 scalar tensor."""
    at = tf.constant((*self.at, self.total_steps), tf.int64)
    return tf.reduce_min(tf.where(at > step, at, at[-1]))

  def as_dataset(self) -> tf.data.Dataset:
    """The loops as a tf.data.Dataset of int64 [first step, end step]
    pairs: what iterating gives, each computed from the one before."""

    def next_loop(step, unused_element):
      end = tf.where(tf.equal(step, 0), tf.ones_like(step),
                     self._next_end(step, _tensor_min,
                                    self._one_off_after_in_graph))
      return end, tf.stack([step, end])

    return tf.data.Dataset.from_tensors(0).repeat().scan(
        tf.constant(self.start, tf.int64), next_loop).take_while(
            lambda bounds: bounds[0] < self.total_steps)


def _tensor_min(*values) -> tf.Tensor:
  """The least of int64 scalars (tensors or Python ints)."""
  return tf.reduce_min(tf.stack([tf.cast(value, tf.int64)
                                 for value in values]))
