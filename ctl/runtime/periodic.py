"""When periodic work is due: every N steps and/or every N seconds."""

import time
from collections.abc import Callable


class Periodic:
  """Says when work (a log, a summary, a checkpoint...) is due; not what it is.

  Step intervals count from step 0, so they fall on the same steps on every
  worker and after every restart. Time intervals count from the last
  `done()` on this process's clock; under several workers, callers must make
  the workers agree (see ctl/steps.py: Steps.train_loop).
  """

  def __init__(self, every_steps: int = 0, every_secs: float = 0.0,
               clock: Callable[[], float] = time.monotonic):
    self._every_steps = every_steps
    self._every_secs = every_secs
    self._clock = clock
    self._last_done = clock()

  def steps_until_due(self, step: int) -> int | None:
    """Steps from `step` to the next step interval; None if there is none."""
    if not self._every_steps:
      return None
    return self._every_steps - step % self._every_steps

  def due_at(self, step: int) -> bool:
    """Whether `step` is on the step interval."""
    return bool(self._every_steps) and step % self._every_steps == 0

  def due_by_time(self) -> bool:
    """Whether every_secs have passed since the last done()."""
    return (bool(self._every_secs) and
            self._clock() - self._last_done >= self._every_secs)

  def done(self) -> None:
    """Records that the work was just done."""
    self._last_done = self._clock()
