"""Every and Periodic say when work is due, by step and by an injected clock."""

from ctl.runtime import periodic


class FakeClock:

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_step_intervals_fall_on_multiples_of_the_interval():
  every_10 = periodic.Every((10,))
  assert [step for step in range(1, 31) if every_10.due(step, False)] == [
      10, 20, 30]
  assert every_10.steps_until(0) == 10
  assert every_10.steps_until(13) == 7
  assert every_10.steps_until(20) == 10


def test_no_interval_is_never_due():
  never = periodic.Every()
  assert not any(never.due(step, False) for step in range(100))
  assert never.steps_until(5) is None
  assert not periodic.Periodic().due_by_time()


def test_time_interval_counts_from_the_last_done():
  clock = FakeClock()
  every_minute = periodic.Periodic(every_secs=60, clock=clock)
  clock.now += 59
  assert not every_minute.due_by_time()
  clock.now += 1
  assert every_minute.due_by_time()
  every_minute.done()
  assert not every_minute.due_by_time()
  clock.now += 60
  assert every_minute.due_by_time()
