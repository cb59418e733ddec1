"""When periodic work is due: every N steps (`Every`), every N seconds
(`Periodic`). Apart from what the work is (ctl/training/loop.py)."""

from collections.abc import Callable
import dataclasses
import time


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
