"""When the work between loops of steps is due, and so where loops end: the
one place that decides.

The work is a run's actions (ctl/actions.py), ctl's and a task's alike, in
the order they run after a loop, the checkpoint last; each says when it is
due with its `When`. The loop (ctl/training/loop.py) asks the `Schedule`
where its loops of steps end (`Schedule.plan`, a `LoopPlan`) and, after
each loop, what is due (`Schedule.after_loop`, a `Due`), and runs it
lowest first. Then, in that order:

- the work due by the loop: by its step or epoch counts or once (at those
  steps), at the end, after every loop, by its clock, or on a request
  already made (SIGTERM's checkpoint);
- after the report writes a log line, the after-report list (`When.
  after_log`), with its values: again if it ran before the line;
- after an evaluation, the after-evaluation list (`When.after_eval`), with
  its results: again if it ran before them;
- after an action's request (stop, checkpoint, evaluate), the work that
  request makes due (`on_request`, and a stop's `at_end`) that has not run
  after this loop.

Work made due joins what is still due; an earlier action can so run after
a later one (a stop's report). The schedule reads no event: the loop tells
it what ran and what it gave (`Due.gave`, `Due.requested`).

Loops end at every step where some action is due by its step or epoch
count or once, so that it runs between loops, and at every multiple of
steps_per_loop: the same steps whether a run started at step 0 or
resumed, so that every action sees the same loops either way.
"""

import bisect
from collections.abc import Callable, Iterator, Sequence, Set
import dataclasses
import time

import tensorflow as tf

from ctl import actions as actions_lib


@dataclasses.dataclass(frozen=True)
class LoopPlan:
  """The (first step, end step) of each loop of steps from `start` to
  `total_steps`.

  A loop ends at every epoch end, at every multiple of each of `every`
  (the steps where some periodic work is due), at each step of `at`
  (sorted: where some one-off work is due) and at every multiple of
  steps_per_loop. A run's first loop from step 0 is one step: it traces
  the functions, and its end times the start-up exactly. A resumed run
  (from a step where a loop ended) cuts its loops where a run from step 0
  cuts them: an action that reads each loop's logs (a rollback's recent
  mean) then decides alike whether or not the run was stopped in between.

  The loops are computed one at a time, as they are needed: in Python by
  iterating the plan (the training loop), in a tf.data pipeline by
  `as_dataset` (in-memory data). Nothing is computed for a whole epoch or
  run, so a run of a billion epochs, or of epochs of a trillion steps,
  starts as fast and in as little memory as a short one.
  """

  start: int
  total_steps: int
  steps_per_epoch: int
  steps_per_loop: int
  every: tuple[int, ...] = ()
  at: tuple[int, ...] = ()

  def __iter__(self) -> Iterator[tuple[int, int]]:
    step = self.start
    while step < self.total_steps:
      end = 1 if step == 0 else self._next_end(step, min,
                                               self._one_off_after)
      yield step, end
      step = end

  def _next_end(self, step, minimum, one_off_after):
    """Where a loop that starts at `step` (not a run's first from step 0)
    ends; `minimum` and `one_off_after`: in Python, or their tensor forms
    in a graph."""
    return minimum(self.total_steps, one_off_after(step),
                   *((step // every + 1) * every for every in (
                       self.steps_per_loop, self.steps_per_epoch,
                       *self.every)))

  def _one_off_after(self, step: int) -> int:
    """The first step of `at` after `step`, or the end."""
    after = bisect.bisect_right(self.at, step)
    return (*self.at[after:after + 1], self.total_steps)[0]

  def _one_off_after_in_graph(self, step: tf.Tensor) -> tf.Tensor:
    """_one_off_after of an int64 scalar tensor."""
    at = tf.constant((*self.at, self.total_steps), tf.int64)
    return tf.reduce_min(tf.where(at > step, at, at[-1]))

  def as_dataset(self) -> tf.data.Dataset:
    """The loops as a tf.data.Dataset of int64 [first step, end step]
    pairs: what iterating gives, each computed from the one before."""

    def next_loop(step, unused_element):
      end = tf.where(tf.equal(step, 0), tf.ones_like(step),
                     self._next_end(step, _tensor_min,
                                    self._one_off_after_in_graph))
      return end, tf.stack([step, end])

    # Plain tensor code: AutoGraph's conversion of these two functions was
    # most of the time a fresh run takes to build its input pipeline.
    return tf.data.Dataset.from_tensors(0).repeat().scan(
        tf.constant(self.start, tf.int64),
        tf.autograph.experimental.do_not_convert(next_loop)).take_while(
            tf.autograph.experimental.do_not_convert(
                lambda bounds: bounds[0] < self.total_steps))


def _tensor_min(*values) -> tf.Tensor:
  """The least of int64 scalars (tensors or Python ints)."""
  return tf.reduce_min(tf.stack([tf.cast(value, tf.int64)
                                 for value in values]))


class Schedule:
  """When each of a run's actions is due, by its index in the run's list.

  Attributes:
    report: the index of the report (its results make after_report due).
    evaluation: the index of the evaluation (its results make after_eval
      due); None for none.
    after_report: the indexes due after each log line.
    after_eval: the indexes due after each evaluation.
  """

  def __init__(self, whens: Sequence[actions_lib.When], *,
               steps_per_epoch: int, total_steps: int, report: int,
               evaluation: int | None = None,
               clock: Callable[[], float] = time.monotonic):
    """Args as named; clock: the clocks' time (a test's own)."""
    self._whens = tuple(whens)
    self._steps_per_epoch = steps_per_epoch
    self._total_steps = total_steps
    self.report, self.evaluation = report, evaluation
    self.after_report = self._indexes(lambda when: when.after_log)
    self.after_eval = self._indexes(lambda when: when.after_eval)
    # The work due by time, on some worker's clock (agreed in train_loop).
    self._clocks = {index: actions_lib.Clock(when.secs, clock)
                    for index, when in enumerate(self._whens) if when.secs}

  def _indexes(self, rule: Callable[[actions_lib.When], bool]
               ) -> tuple[int, ...]:
    """The indexes of the work whose When the rule says yes to."""
    return tuple(index for index, when in enumerate(self._whens)
                 if rule(when))

  def plan(self, step: int, steps_per_loop: int) -> LoopPlan:
    """The loops from `step` to the end: they end where some work is due by
    its step or epoch count, or once (the one-off steps still ahead)."""
    every = sorted({every for when in self._whens
                    for every in when.step_intervals(self._steps_per_epoch)})
    at = sorted({at for when in self._whens for at in when.one_off_steps()
                 if step < at < self._total_steps})
    return LoopPlan(step, self._total_steps, self._steps_per_epoch,
                              steps_per_loop, tuple(every), tuple(at))

  def report_due_at(self, step: int) -> bool:
    """Whether the report is due after `step` by its counts or as the end
    of training (a loop that ends there reads the train metrics)."""
    return self._whens[self.report].due_at(
        step, self._steps_per_epoch, step >= self._total_steps)

  def clocks_due(self) -> tuple[bool, ...]:
    """For each action with a clock (in index order): whether its time is
    up on this process's clock."""
    return tuple(self._clocks[index].due() for index in sorted(self._clocks))

  def timed(self, agreed: Sequence[bool]) -> set[int]:
    """The indexes due by time: `agreed`, the workers' answer to
    clocks_due, in the same order."""
    return {index for index, due in zip(sorted(self._clocks), agreed) if due}

  def after_loop(self, step: int, requests: Sequence[str],
                 timed: Set[int] = frozenset()) -> 'Due':
    """The work due after a loop that ended at `step`: by its counts, the
    end, every loop, the requests already made, or its clock (`timed`)."""
    end = step >= self._total_steps or 'stop' in requests
    return Due(self, {
        index for index, when in enumerate(self._whens)
        if when.due_at(step, self._steps_per_epoch, end) or
        when.every_loop or index in timed or
        (when.on_request and when.on_request in requests)})

  def on_requests(self, requests: Sequence[str]) -> tuple[int, ...]:
    """The indexes that new requests make due (a stop: the end's work)."""
    return self._indexes(lambda when: bool(
        (when.on_request and when.on_request in requests) or
        (when.at_end and 'stop' in requests)))

  def ran(self, index: int) -> None:
    """Restarts the clock of the work that ran, if it has one."""
    if index in self._clocks:
      self._clocks[index].reset()


class Due:
  """The work still due after one loop; iterating runs it lowest first,
  with what reports, evaluations and requests make due on the way. Each
  runs once after a loop, or again for a log line or an evaluation that
  came after it ran."""

  def __init__(self, schedule: Schedule, due: set[int]):
    self._schedule = schedule
    self._due = set(due)
    self._ran: set[int] = set()

  def __iter__(self) -> Iterator[int]:
    while self._due:
      index = min(self._due)
      self._due.discard(index)
      self._ran.add(index)
      self._schedule.ran(index)
      yield index

  def gave(self, index: int, results) -> None:
    """The work at `index` ran and gave `results` (None: nothing): a
    report's log line or an evaluation's results make their lists due."""
    if results is None:
      return
    if index == self._schedule.report:
      self._due.update(self._schedule.after_report)
    if index == self._schedule.evaluation:
      self._due.update(self._schedule.after_eval)

  def requested(self, requests: Sequence[str]) -> None:
    """New requests: the work they make due that has not run yet."""
    self._due.update(index for index in self._schedule.on_requests(requests)
                     if index not in self._ran)
