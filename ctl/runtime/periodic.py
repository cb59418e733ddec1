"""When periodic work is due: every N steps (`Every`), every N seconds
(`Periodic`), and where loops of steps end so that it falls between them
(`LoopPlan`). Apart from what the work is (ctl/training/loop.py)."""

from collections.abc import Callable, Iterator
import dataclasses
import time

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Every:
  """Due every N steps for each N of `steps` (0: never), and/or at the end
  of every epoch and of training.

  Step intervals count from step 0, so they fall on the same steps on every
  worker and after every restart.
  """

  steps: tuple[int, ...] = ()
  at_epoch_end: bool = False

  def due(self, step: int, end_of_epoch: bool) -> bool:
    return ((self.at_epoch_end and end_of_epoch) or
            any(every and step % every == 0 for every in self.steps))

  def steps_until(self, step: int) -> int | None:
    """Steps from `step` to the next due step by count; None if never."""
    return min((every - step % every for every in self.steps if every),
               default=None)


@dataclasses.dataclass(frozen=True)
class LoopPlan:
  """The (first step, end step) of each loop of steps from `start` to
  `total_steps`.

  A loop ends at every epoch end and at every multiple of each of `every`
  (the steps where some periodic work is due), after at most
  steps_per_loop steps. The first is one step: it traces the functions,
  and its end times the start-up exactly.

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

  def __iter__(self) -> Iterator[tuple[int, int]]:
    step = self.start
    while step < self.total_steps:
      end = step + 1 if step == self.start else self._next_end(step)
      yield step, end
      step = end

  def _next_end(self, step: int) -> int:
    return min(step + self.steps_per_loop, self.total_steps,
               *((step // every + 1) * every
                 for every in (self.steps_per_epoch, *self.every)))

  def epoch_bounds(self, epoch: tf.Tensor) -> tf.Tensor:
    """The loops of epoch `epoch` (an int64 scalar), as [n, 2] int64 step
    offsets within it: what iterating gives, computed in a graph (a
    tf.data function)."""
    first = epoch * self.steps_per_epoch
    low = tf.maximum(first, self.start)
    high = tf.minimum(first + self.steps_per_epoch, self.total_steps)

    def body(step, bounds):
      end = tf.reduce_min(tf.stack([
          step + self.steps_per_loop, tf.constant(self.total_steps, tf.int64),
          *((step // every + 1) * every
            for every in (self.steps_per_epoch, *self.every))]))
      end = tf.where(tf.equal(step, self.start), step + 1, end)
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


class Periodic:
  """Due when every_secs have passed since the last `done()` (0: never).

  Counted on this process's clock; under several workers, callers must make
  the workers agree (ctl/training/steps.py: StepRunner.train_loop).
  """

  def __init__(self, every_secs: float = 0.0,
               clock: Callable[[], float] = time.monotonic):
    self._every_secs = every_secs
    self._clock = clock
    self._last_done = clock()

  def due_by_time(self) -> bool:
    """Whether every_secs have passed since the last done()."""
    return (bool(self._every_secs) and
            self._clock() - self._last_done >= self._every_secs)

  def done(self) -> None:
    """Records that the work was just done."""
    self._last_done = self._clock()
