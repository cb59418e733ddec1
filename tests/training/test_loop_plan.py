"""A LoopPlan ends loops where actions are due, the same in Python and in
a graph; When and Clock say when an action is due, by step count, once at
given steps and by an injected clock."""

import itertools
import subprocess
import sys

import pytest

from ctl import actions
from ctl.training import loop_plan
import helpers


class FakeClock:

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_step_intervals_fall_on_multiples_of_the_interval():
  every_10 = actions.When(steps=10)
  assert [step for step in range(1, 31)
          if every_10.due_at(step, 7, end=False)] == [10, 20, 30]
  by_epoch = actions.When(steps=(4,), epochs=2, at_end=True)
  assert by_epoch.step_intervals(7) == (4, 14)
  assert [step for step in range(1, 31)
          if by_epoch.due_at(step, 7, end=step == 30)] == [
              4, 8, 12, 14, 16, 20, 24, 28, 30]


def test_one_off_steps_are_due_once_and_are_no_intervals():
  at_5_and_8 = actions.When(at_steps=(5, 8), steps=10)
  assert at_5_and_8.step_intervals(7) == (10,)
  assert at_5_and_8.one_off_steps() == (5, 8)
  assert [step for step in range(1, 31)
          if at_5_and_8.due_at(step, 7, end=False)] == [5, 8, 10, 20, 30]
  at_3 = actions.When(at_steps=3)
  assert [step for step in range(1, 31)
          if at_3.due_at(step, 7, end=False)] == [3]


def test_no_interval_is_never_due():
  never = actions.When()
  assert not any(never.due_at(step, 5, end=False) for step in range(100))
  assert not actions.Clock(0).due()


def test_time_interval_counts_from_the_last_run():
  clock = FakeClock()
  every_minute = actions.Clock(60, clock=clock)
  clock.now += 59
  assert not every_minute.due()
  clock.now += 1
  assert every_minute.due()
  every_minute.reset()
  assert not every_minute.due()
  clock.now += 60
  assert every_minute.due()


@pytest.mark.parametrize('start, total, per_epoch, per_loop, every, at', [
    (0, 30, 7, 4, (), ()), (5, 61, 10, 100, (3, 25), ()),
    (13, 14, 5, 2, (4,), ()), (0, 1, 1, 1, (), ()), (9, 45, 9, 9, (6,), ()),
    (0, 61, 10, 100, (25,), (1, 6, 9, 13, 50)), (5, 61, 10, 7, (), (6, 59)),
])
def test_a_loop_plan_is_the_same_in_python_and_in_a_graph(
    start, total, per_epoch, per_loop, every, at):
  plan = loop_plan.LoopPlan(start, total, per_epoch, per_loop, every, at)
  loops = list(plan)
  assert loops[0][0] == start
  assert loops[-1][1] == total
  assert all(end == next_start
             for (_, end), (next_start, _) in zip(loops, loops[1:]))
  in_graph = [tuple(bounds) for bounds in plan.as_dataset().as_numpy_iterator()]
  assert in_graph == loops
  for start_step, end in loops:
    assert end - start_step <= per_loop
    assert start_step // per_epoch == (end - 1) // per_epoch  # One epoch.
    stops = [step for step in range(start_step + 1, end)
             if any(step % interval == 0 for interval in (per_loop, *every))
             or step in at]
    assert not stops  # Loops end where work is due.


def test_one_off_steps_end_loops_there_and_nowhere_else():
  periodic = list(loop_plan.LoopPlan(0, 88, 44, 100, (11,)))
  with_one_offs = list(loop_plan.LoopPlan(0, 88, 44, 100, (11,), (5, 8)))
  ends = [end for _, end in periodic]
  assert [end for _, end in with_one_offs] == sorted(ends + [5, 8])


@pytest.mark.parametrize('total, per_epoch, per_loop, every', [
    (61, 10, 4, (3, 25)), (45, 9, 9, (6,)), (30, 7, 100, ()),
])
def test_a_resumed_plan_cuts_its_loops_where_a_plan_from_step_0_does(
    total, per_epoch, per_loop, every):
  # A run resumes from a step where one of its loops ended; its loops must
  # be the rest of the uninterrupted run's, or an action reading each
  # loop's logs (a rollback) decides otherwise.
  whole = list(loop_plan.LoopPlan(0, total, per_epoch, per_loop, every))
  assert whole[0] == (0, 1)  # Times the start-up.
  for index, (start, _) in enumerate(whole[1:], 1):
    resumed = loop_plan.LoopPlan(start, total, per_epoch, per_loop, every)
    assert list(resumed) == whole[index:], start


@pytest.mark.parametrize('steps_per_epoch, num_epochs', [(44, 10**9),
                                                         (10**12, 1)])
def test_a_long_plan_costs_what_a_short_one_does(steps_per_epoch, num_epochs):
  plan = loop_plan.LoopPlan(0, steps_per_epoch * num_epochs, steps_per_epoch,
                            100, (10,))
  assert list(itertools.islice(plan, 3)) == [(0, 1), (1, 10), (10, 20)]
  assert [tuple(bounds) for bounds in
          plan.as_dataset().take(3).as_numpy_iterator()] == [
              (0, 1), (1, 10), (10, 20)]


def test_the_plan_s_pipeline_is_traced_without_autograph(tmp_path):
  # AutoGraph writes each function it converts to a file in the temporary
  # directory (deleted at exit); converting the plan's two functions was
  # most of a fresh run's input-pipeline building. A process of its own:
  # AutoGraph converts a function once per process.
  script = (
      'import glob, os, tempfile\n'
      'from ctl.training import loop_plan\n'
      'plan = loop_plan.LoopPlan(0, 30, 10, 4, (5,))\n'
      'print(list(plan.as_dataset().as_numpy_iterator())[:2])\n'
      'print("CONVERTED", glob.glob(os.path.join(tempfile.gettempdir(), '
      '"__autograph_generated_file*.py")))\n')
  run = subprocess.run([sys.executable, '-c', script], capture_output=True,
                       text=True, timeout=600,
                       env=helpers.env_with(TMPDIR=str(tmp_path)))
  assert run.returncode == 0, run.stderr[-3000:]
  assert 'CONVERTED []' in run.stdout, run.stdout
