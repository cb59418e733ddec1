"""How long this process was kept from running (a worker's status file's
'stalled' seconds: ctl/cluster/worker_status.py)."""

import threading
import time

# How often the stall meter looks at the clock; a look later than twice
# this counts as time the process was kept from running.
_STALL_TICK_SECONDS = 0.05


class StallMeter:
  """Seconds this process was kept from running: stopped (SIGSTOP), or
  starved of CPU by the machine.

  A thread sleeps `_STALL_TICK_SECONDS` again and again; a wake-up much
  later than asked means no thread of the process ran meanwhile. Neither
  the process's CPU time nor a loop's wall time shows such a stall: the
  all-reduce makes every worker's loop as long as the slowest's.
  """

  def __init__(self):
    self._stalled = 0.0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._measure, daemon=True,
                                    name='ctl-stall-meter')
    self._thread.start()

  def seconds(self) -> float:
    """Stalled seconds since the meter started."""
    return self._stalled

  def stop(self) -> None:
    self._stop.set()

  def _measure(self) -> None:
    before = time.monotonic()
    while not self._stop.wait(_STALL_TICK_SECONDS):
      now = time.monotonic()
      if now - before > 2 * _STALL_TICK_SECONDS:
        self._stalled += now - before - _STALL_TICK_SECONDS
      before = now
