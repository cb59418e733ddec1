"""SIGTERM: finish the current loop of steps, save, and exit with code 42.

Schedulers preempt with SIGTERM and, after a grace period, SIGKILL
(Slurm's KillWait, Kubernetes' terminationGracePeriodSeconds). The handler
only records the request; the training loop passes it into the next
`train_loop` call, which all-reduces it with the other workers' requests,
so every worker stops after the same step and takes part in the same save.
That costs no extra synchronisation, so it is used for every strategy.

Once a MultiWorkerMirroredStrategy exists, TensorFlow's runtime catches
SIGTERM and only sets a flag of its own; a Python handler installed after
the strategy is built replaces that, so `StopSignal` must be entered after
`distribution.build_strategy`.
"""

import signal
import threading

from absl import logging


class StopSignal:
  """A context in which SIGTERM requests a stop instead of killing."""

  def __init__(self, signum: int = signal.SIGTERM):
    self._signum = signum
    self._previous = None
    self._installed = False
    self.requested = False

  def __enter__(self) -> 'StopSignal':
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(self._signum, self._handle)
      self._installed = True
    else:
      logging.warning('Not on the main thread: %s will not stop training '
                      'cleanly.', signal.Signals(self._signum).name)
    return self

  def __exit__(self, *exc_info) -> None:
    if self._installed:
      signal.signal(self._signum, self._previous)

  def _handle(self, signum, frame) -> None:
    del frame
    if not self.requested:
      logging.warning('Received %s: saving a checkpoint after this loop of '
                      'steps, then exiting with code 42.',
                      signal.Signals(signum).name)
    self.requested = True
