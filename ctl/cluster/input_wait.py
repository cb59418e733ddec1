"""How long a worker's steps wait for their input: timed in the loop's graph.

A worker's input is read inside the train loop's tf.function (the next
element of its tf.data iterator, or a loop's example indices), so no
Python clock sees it. Two `tf.timestamp` ops around each read, ordered by
control dependencies, and their difference added to a variable of this
worker: its status file (ctl/cluster/worker_status.py) reads the variable
at each report, and the chief's straggler check compares the workers'.

A worker whose input pipeline is slow waits here while the others wait in
the all-reduce for it: that is what tells an input-bound straggler from a
compute-bound one (ctl/cluster/stragglers.py).
"""

from collections.abc import Callable
from typing import Any

import tensorflow as tf


class InputWait:
  """The seconds this worker's steps waited for their input."""

  def __init__(self):
    # A plain variable of this worker, made outside any strategy's scope
    # (as the watchdog's step count): never mirrored, never all-reduced.
    self._seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                name='ctl_input_wait')

  def timed(self, read: Callable[[], Any]) -> Any:
    """read(), traced with its wait added to the clock (in a graph)."""
    start = tf.timestamp()
    with tf.control_dependencies([start]):
      batch = read()
    done = [tensor for tensor in tf.nest.flatten(batch, expand_composites=True)
            if isinstance(tensor, tf.Tensor)]
    with tf.control_dependencies(done):
      # The function's automatic control dependencies order it before the
      # next step's read (both are stateful).
      self._seconds.assign_add(tf.timestamp() - start)
    return batch

  def seconds(self) -> float:
    """The seconds counted so far (read between loops)."""
    return float(self._seconds.numpy())


def make(num_workers: int, deterministic: bool) -> InputWait | None:
  """The clock for a job of several workers (whose straggler check compares
  them); None for one worker, whose steps then time nothing, and under op
  determinism (config.deterministic), where TensorFlow refuses to run
  `tf.timestamp` (FailedPreconditionError)."""
  return InputWait() if num_workers > 1 and not deterministic else None
