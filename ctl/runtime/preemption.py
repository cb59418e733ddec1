"""SIGTERM or Ctrl-C: finish the current loop of steps, save, exit with 42.

Schedulers preempt with SIGTERM and, after a grace period, SIGKILL
(Slurm's KillWait, Kubernetes' terminationGracePeriodSeconds). The handler
only records the request; the training loop passes it into the next
`train_loop` call, which all-reduces it with the other workers' requests,
so every worker stops after the same step and takes part in the same save.
That costs no extra synchronisation, so it is used for every strategy.
Ctrl-C (SIGINT) does the same; a second Ctrl-C stops at once, without
saving (the latest checkpoint stays the one to resume from).

Once a MultiWorkerMirroredStrategy exists, TensorFlow's runtime catches
SIGTERM and only sets a flag of its own; a Python handler installed after
the strategy is built replaces that, so `StopSignal` must be entered after
`distribution.build_strategy`.
"""

import os
import signal
import threading

from absl import logging

# The code of a process stopped by a second Ctrl-C, as a shell reports one
# ended by SIGINT.
EXIT_INTERRUPTED = 128 + signal.SIGINT


class StopSignal:
  """A context in which SIGTERM and SIGINT request a stop instead of
  killing."""

  def __init__(self, signums: tuple[int, ...] = (signal.SIGTERM,
                                                 signal.SIGINT)):
    self._signums = signums
    self._previous = {}
    self.requested = False
    self.received = None  # The name of the signal that asked first.

  def __enter__(self) -> 'StopSignal':
    if threading.current_thread() is threading.main_thread():
      for signum in self._signums:
        self._previous[signum] = signal.signal(signum, self._handle)
    else:
      logging.warning('Not on the main thread: SIGTERM will not stop '
                      'training cleanly.')
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    del frame
    name = 'Ctrl-C' if signum == signal.SIGINT else signal.Signals(signum).name
    if self.requested and signum == signal.SIGINT:
      # Straight to the file descriptor: no Python buffer to meet.
      os.write(2, b'\nctl: error: Ctrl-C twice: stopped at once, without '
               b'saving. Run the same command again to resume from the '
               b'latest checkpoint.\n')
      os._exit(EXIT_INTERRUPTED)  # pylint: disable=protected-access
    if self.requested:
      return
    # The request first: whatever happens to the message below (a signal
    # handler that writes can meet the interrupted write of the same
    # stream), the stop is not lost.
    self.received = name
    self.requested = True
    try:
      logging.warning('Received %s: saving a checkpoint after this loop of '
                      'steps, then exiting with code 42%s.', name,
                      ' (Ctrl-C again: stop now, without saving)'
                      if signum == signal.SIGINT else '')
    except Exception:  # pylint: disable=broad-except
      pass
