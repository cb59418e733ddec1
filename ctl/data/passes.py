"""A task's finite tf.data.Dataset read pass after pass, as `repeat()` reads
it, with a saved position that restores exactly.

Why not `dataset.repeat()`: a shuffle that reshuffles each pass (TF's
default) draws each pass's seeds from a generator that its dataset shares
between iterators, and an iterator checkpoint holds the generator's count
only in that shuffle's own state. An op that has read its input to the end
(a `prefetch` holding the pass's last batches, a batch that read the last
element) leaves its input's state out of the checkpoint, so a position
saved near a pass's end restored that pass but drew the next pass's seeds
from whatever count the restoring process had left: another order (TF
2.21: `range(64).shuffle(64, seed=1).batch(8).prefetch(2).repeat()` saved
two batches before a pass's end read another next pass in 17 of 20
restores; BUILD.md, "Exact resume of a reshuffled pipeline").

Here each pass has an iterator of its own, made when the pass before it
starts, which draws the same seeds in the same order as `repeat()` does.
The next pass's iterator, not yet read, is saved beside the current one:
its state always holds the generator's count, and it is restored after
the current one (`read_last`, for DataPositions), so the count is right
whatever the current pass's ops left out. At a pass's end the current
iterator takes on the next one's state and the next one starts over,
drawing the seeds of the pass after. A reshuffling shuffle below a
`repeat` or another shuffle of the task's own cannot be helped so: it is
refused before training (`tf_internals.reseeding_below_restart`).
"""

import tensorflow as tf

from ctl.runtime import tf_internals


class Passes:
  """Elements of a finite dataset, one pass after another."""

  read_last = ('next_pass',)  # Restored after the rest (see above).

  def __init__(self, dataset: tf.data.Dataset):
    with tf.device('/cpu:0'):
      self._current = iter(dataset)
      self._next = iter(dataset)
    self.checkpointable = {'iterator': self._current,
                           'next_pass': self._next}

  def get_next(self):
    """The next element, the next pass's first when this one has ended."""
    element = self._current.get_next_as_optional()
    return tf.cond(element.has_value(), element.get_value, self._next_pass)

  def _next_pass(self):
    with tf.control_dependencies(
        [tf_internals.copy_iterator_state(self._next, self._current)]):
      restart = tf_internals.restart_iterator(self._next)
    with tf.control_dependencies([restart]):
      return self._current.get_next()


class Endless:
  """Elements of a dataset that repeats itself (or never ends)."""

  read_last = ()

  def __init__(self, dataset: tf.data.Dataset):
    with tf.device('/cpu:0'):
      self._iterator = iter(dataset)
    self.checkpointable = {'iterator': self._iterator}

  def get_next(self):
    return self._iterator.get_next()
