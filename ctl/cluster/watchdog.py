"""The bound on every wait for another worker: one watchdog thread a worker.

TensorFlow can bound each collective itself (`CommunicationOptions(
timeout_seconds=...)`), but it does so with a new thread per collective
that sleeps for the whole timeout (TF 2.21, `BaseCollectiveExecutor`:
"TODO: Share the timeout watchdog thread among collectives"). With 600 s,
a worker of the 2-worker CNN held 16,000 such threads after six minutes,
and then both workers died of SIGABRT when the machine ran out of thread
ids ("Resource temporarily unavailable"; BUILD.md); making the threads
also cost each step about 5%. So ctl's collectives have no timeout of
their own, and this watchdog bounds them instead: a worker that has made
no progress for `config.distribution.timeout_seconds` aborts its
collectives. Its wait for a peer then fails (DeadlineExceededError: exit
code 43, failures.py), as TensorFlow's timeout would have made it.

Progress is a training step done (the `steps` variable, which the train
loop counts up inside its graph), or whatever the Python side marks with
`beat()`: a loop, an action, an evaluation batch. The watchdog does not
count the making of the task's data and pipelines (`paused()`), which
waits on no peer; a step's wait for its input it does count. A
worker that still has not finished a timeout after the abort (stuck
outside TensorFlow's collectives, e.g. in a task's own Python) exits with
code 43: nothing hangs.

A peer whose process is gone does not wait out the timeout: while this
worker waits (no progress for a few seconds), `gone_peer` (the peers on
this machine, ctl/cluster/peer_evidence.py) is asked each poll, and a
peer proven gone aborts the collectives at once. TensorFlow notices most
such deaths itself (a broken connection), but not all: a worker that
waits for a peer's request, not on one of its own, waits for the
coordination service's heartbeat, twice the timeout.
"""

from collections.abc import Callable
import contextlib
import os
import sys
import threading
import time

from absl import logging
import tensorflow as tf

from ctl import errors
from ctl.runtime import tf_cluster_internals

# Begins the message of the error an abort gives the waiting collectives
# (failures.py tells the watchdog's abort from TensorFlow's by it).
ABORT_MESSAGE = 'ctl: no progress for distribution.timeout_seconds='
# Begins the message of an abort because a peer's process is gone.
PEER_GONE_MESSAGE = 'ctl: a peer\'s process is gone: '
# The longest the watchdog sleeps between two looks.
_MAX_POLL_SECONDS = 1.0
# How long without progress before the watchdog asks whether a peer is gone
# (a step's wait for a live peer is shorter).
_ASK_GONE_AFTER_SECONDS = 2.0


def ended_the_wait(error: BaseException) -> bool:
  """Whether error is one a watchdog's abort gave the waiting collectives
  (rather than TensorFlow's own report of a lost peer)."""
  return ABORT_MESSAGE in str(error) or PEER_GONE_MESSAGE in str(error)


class Watchdog:
  """Aborts this worker's collectives after timeout_seconds without progress.

  Use it as a context (the thread runs inside it). Disabled (timeout 0),
  it does nothing and has no `steps`. A job of one worker has none
  (ctl/training/run.py): it waits on no peer.
  """

  def __init__(self, timeout_seconds: float, enabled: bool = True,
               on_abort: Callable[[str], None] | None = None):
    """Args as named; on_abort: called with why on the watchdog's thread
    before it aborts the collectives, while the stuck thread still is
    where it stuck (the diagnostics dump)."""
    self.on_abort = on_abort
    # Says which peer's process is gone, if one is (None: none known).
    self.gone_peer: Callable[[], str | None] | None = None
    self.timeout_seconds = timeout_seconds
    self.enabled = bool(enabled and timeout_seconds > 0)
    # Steps trained: the train loop adds one after each step, in its graph.
    # A plain variable of this worker, made outside any strategy's scope.
    self.steps = (tf.Variable(0, dtype=tf.int64, trainable=False,
                              name='ctl_watchdog_steps')
                  if self.enabled else None)
    self._lock = threading.Lock()
    self._last_progress = time.monotonic()
    self._steps_seen = 0
    self._pauses = 0
    self._stopped = threading.Event()
    self._thread = None

  def __enter__(self) -> 'Watchdog':
    if self.enabled:
      self.beat()
      self._thread = threading.Thread(target=self._watch, daemon=True,
                                      name='ctl-watchdog')
      self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._stopped.set()
    if self._thread is not None:
      self._thread.join()

  def beat(self) -> None:
    """Marks progress now."""
    self._last_progress = time.monotonic()

  def seconds_since_progress(self) -> float:
    """Seconds since the last step, beat or pause ended; 0 while paused."""
    return self._stalled_seconds()

  @contextlib.contextmanager
  def paused(self):
    """Work of this worker alone (reading data): not counted."""
    with self._lock:
      self._pauses += 1
    try:
      yield
    finally:
      with self._lock:
        self._pauses -= 1
      self.beat()

  def _watch(self) -> None:
    poll = min(_MAX_POLL_SECONDS, self.timeout_seconds / 10)
    while not self._stopped.wait(poll):
      stalled = self._stalled_seconds()
      if stalled > self.timeout_seconds:
        self._abort(f'No progress for {self.timeout_seconds:g} s (config.'
                    'distribution.timeout_seconds): a peer died or hangs, or '
                    'this worker does',
                    f'{ABORT_MESSAGE}{self.timeout_seconds:g}')
        return
      gone = (self._ask_gone_peer() if stalled > _ASK_GONE_AFTER_SECONDS
              else None)
      if gone:
        self._abort(f'Waiting for a peer whose process is gone ({gone})',
                    f'{PEER_GONE_MESSAGE}{gone}')
        return

  def _ask_gone_peer(self) -> str | None:
    """gone_peer's answer; None when there is none, or it failed."""
    if self.gone_peer is None:
      return None
    try:
      return self.gone_peer()
    except Exception as error:  # pylint: disable=broad-except
      logging.warning('Could not look for a gone peer: %s', error)
      return None

  def _stalled_seconds(self) -> float:
    """Seconds since the last progress; 0 while paused."""
    now = time.monotonic()
    try:
      # Concurrently with the train loop (and the status file's writer).
      steps = (int(self.steps.numpy()) if self.steps is not None
               else self._steps_seen)
    except Exception:  # pylint: disable=broad-except
      # Never leave the watch: the beats still count.
      steps = self._steps_seen
    with self._lock:
      if self._pauses:
        self._last_progress = now
      if steps != self._steps_seen:
        self._steps_seen, self._last_progress = steps, now
      return now - self._last_progress

  def _abort(self, why: str, message: str) -> None:
    """Fails this worker's collectives with message; exits if that does
    not end it."""
    logging.error('%s. Aborting its collectives.', why)
    if self.on_abort is not None:
      try:
        self.on_abort(why)
      except Exception as error:  # pylint: disable=broad-except
        logging.error('Could not write the diagnostics: %s', error)
    tf_cluster_internals.abort_collectives(message)
    if self._stopped.wait(self.timeout_seconds):
      return  # The failure reached the training loop: it says what to do.
    print(f'ctl: error: This worker made no progress for '
          f'{2 * self.timeout_seconds:g} s (twice distribution.timeout_'
          'seconds) and is stuck outside TensorFlow\'s collectives, so it '
          'exits. Nothing was saved after the latest checkpoint; restart '
          'every worker to resume from it.', file=sys.stderr, flush=True)
    logging.flush()
    sys.stdout.flush()
    # Not the exit handlers (tf_process.exit_now): one may wait for the
    # stuck thread.
    os._exit(errors.EXIT_PEER_FAILED)  # pylint: disable=protected-access
