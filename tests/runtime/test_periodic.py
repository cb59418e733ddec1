"""Every and Periodic say when work is due, by step and by an injected
clock; a LoopPlan ends loops there, the same in Python and in a graph."""

import pytest
import tensorflow as tf

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


@pytest.mark.parametrize('start, total, per_epoch, per_loop, every', [
    (0, 30, 7, 4, ()), (5, 61, 10, 100, (3, 25)), (13, 14, 5, 2, (4,)),
    (0, 1, 1, 1, ()), (9, 45, 9, 9, (6,)),
])
def test_a_loop_plan_is_the_same_in_python_and_in_a_graph(
    start, total, per_epoch, per_loop, every):
  plan = periodic.LoopPlan(start, total, per_epoch, per_loop, every)
  loops = list(plan)
  assert loops[0] == (start, start + 1)
  assert loops[-1][1] == total
  assert all(end == next_start
             for (_, end), (next_start, _) in zip(loops, loops[1:]))
  in_graph = []
  for epoch in range(*plan.epochs):
    for low, high in plan.epoch_bounds(tf.constant(epoch, tf.int64)).numpy():
      in_graph.append((epoch * per_epoch + low, epoch * per_epoch + high))
  assert in_graph == loops
  for start_step, end in loops:
    assert end - start_step <= per_loop
    assert start_step // per_epoch == (end - 1) // per_epoch  # One epoch.
    stops = [step for step in range(start_step + 1, end)
             if any(step % interval == 0 for interval in every)]
    assert not stops  # Loops end where work is due.


def test_a_plan_of_a_billion_epochs_costs_what_a_short_one_does():
  plan = periodic.LoopPlan(0, 44 * 10**9, 44, 100, (10,))
  assert next(iter(plan)) == (0, 1)
  assert plan.epoch_bounds(tf.constant(10**9 - 1, tf.int64)).numpy()[-1][1] \
      == 44
