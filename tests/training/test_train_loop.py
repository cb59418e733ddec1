"""The loop alone, in this process, as Orbit's controller_test tests its
controller: a TrainLoop of a fake step runner (no TensorFlow training) and
plain actions, one scheduling rule a test -- every interval, once at given
steps, after each log line and evaluation, by the clock, an action's stop,
its rollback, SIGTERM between loops, the checkpoint last -- and the
schedule (ctl/training/loop_plan.py) alone."""

import os
import signal
import time

import pytest
import tensorflow as tf

import ctl
from ctl import errors
from ctl.cluster import distribution
from ctl.runtime import tf_process
from ctl.training import job as job_lib
from ctl.training import loop as loop_lib
from ctl.training import loop_plan
from ctl.training import report as report_lib
from ctl.training import state as state_lib

When = ctl.When


class FakeRunner:
  """Trains nothing: counts the steps of each loop and gives back a loss
  (`loss(step)`) and this worker's requests as every worker's."""

  def __init__(self, loss=lambda step: 1.0, on_loop=None):
    self.step = 0
    self.loops = []  # (end step, whether it read the train metrics)
    self._loss = loss
    self._on_loop = on_loop

  def train_loop(self, iterator, num_steps, requests, read_metrics=False):
    del iterator  # The plan's loops are all it needs.
    self.step += int(num_steps)
    self.loops.append((self.step, read_metrics))
    if self._on_loop:
      self._on_loop(self.step)
    return {'logs': {'loss': self._loss(self.step)}, 'loop_logs': {},
            'requests': requests}


class Does(ctl.Action):
  """Records (name, step) in `record` when it runs; then does `then`."""

  on_every_worker = True

  def __init__(self, name, when, record, then=None):
    self._name, self.when, self._record, self._then = name, when, record, then
    self.seen = []  # (step, logged, evaluated, train_logs, eval_results)

  @property
  def name(self):
    return self._name

  def run(self, event):
    self._record.append((self._name, event.step))
    self.seen.append((event.step, event.logged, event.evaluated,
                      event.train_logs, event.eval_results))
    if self._then:
      self._then(event)


class Report(Does):
  """The report: the steps since the last report, as its values."""

  def __init__(self, when, record):
    super().__init__('report', when, record)
    self.steps, self.latest = 0, {}

  def add(self, logs, num_steps, loop_logs, metrics=None):
    del logs, loop_logs, metrics
    self.steps += num_steps

  def restored(self):
    self._record.append(('restored', None))
    self.steps = 0

  def run(self, event):
    super().run(event)
    if not self.steps:
      return None
    self.latest, self.steps = {'steps': self.steps}, 0
    return self.latest


class Evaluate(Does):
  """The evaluation: its results are the step."""

  def run(self, event):
    super().run(event)
    return {'step': event.step}


class Checkpoint(Does):
  """The checkpoint: records its saves; a rollback gets the latest back."""

  def __init__(self, when, record):
    super().__init__('checkpoint', when, record)
    self.saved = [0]

  def run(self, event):
    super().run(event)
    self.saved.append(event.step)

  def restore_weights(self):
    self._record.append(('restore_weights', self.saved[-1]))
    return self.saved[-1]


def _loop(actions, record, *, first=(), total_steps=12, steps_per_epoch=100,
          steps_per_loop=100, report=When(steps=4, at_end=True),
          checkpoint=When(at_end=True, on_request='checkpoint'),
          evaluation=None, stop_signal=None, clock=time.monotonic):
  """A TrainLoop of a FakeRunner and the work: `first`, the report,
  `actions` (evaluation, an Evaluate, among them or None), the checkpoint;
  returns it, its runner and its checkpoint."""
  reporter = Report(report, record)
  saves = Checkpoint(checkpoint, record)
  work = loop_lib.Work([*first, reporter, *actions], report=reporter,
                       checkpoint=saves, evaluation=evaluation)
  wiring = loop_lib.Wiring(
      length=state_lib.TrainingLength(
          global_batch_size=8, eval_batch_size=8,
          steps_per_epoch=steps_per_epoch, total_steps=total_steps),
      steps_per_loop=steps_per_loop, task=None, workdir='unused',
      job=job_lib.Job(tf.distribute.get_strategy(),
                      distribution.Role(None, 0, 1, True)),
      process=job_lib.Process(stop_signal or tf_process.StopSignal(), None,
                              tf_process.run_start_up()),
      speed=report_lib.SpeedMeter())
  runner = FakeRunner()
  return loop_lib.TrainLoop(runner, work, wiring, clock=clock), runner, saves


def _run(loop, start=0):
  """Runs the loop's plan from `start`; what run returns."""
  return loop.run(None, loop.plan(start))


def _steps(record, name):
  """The steps after which `name` ran, in order."""
  return [step for who, step in record if who == name]


def test_work_due_every_n_steps_or_epochs_runs_after_those_steps_only():
  record = []
  loop, runner, _ = _loop([Does('every 3', When(steps=3), record),
                           Does('each epoch', When(epochs=1), record)],
                          record, total_steps=12, steps_per_epoch=5)
  assert _run(loop) is None
  # Loops end at every step where some work is due; the first is one step.
  assert [end for end, _ in runner.loops] == [1, 3, 4, 5, 6, 8, 9, 10, 12]
  assert _steps(record, 'every 3') == [3, 6, 9, 12]
  assert _steps(record, 'each epoch') == [5, 10]
  assert _steps(record, 'report') == [4, 8, 12]
  # A loop ending at a report reads the train metrics, others do not.
  assert [end for end, read in runner.loops if read] == [4, 8, 12]


def test_work_at_given_steps_runs_once_and_a_resume_runs_only_those_ahead():
  record = []
  loop, runner, _ = _loop([Does('at', When(at_steps=(5, 7)), record)],
                          record, total_steps=10, report=When(at_end=True))
  _run(loop)
  assert [end for end, _ in runner.loops] == [1, 5, 7, 10]
  assert _steps(record, 'at') == [5, 7]
  record.clear()
  resumed, runner, _ = _loop([Does('at', When(at_steps=(5, 7)), record)],
                             record, total_steps=10, report=When(at_end=True))
  assert list(resumed.plan(6)) == [(6, 7), (7, 10)]
  runner.step = 6
  _run(resumed, 6)
  assert _steps(record, 'at') == [7]


def test_after_a_log_line_and_an_evaluation_their_lists_run_with_the_results():
  record = []
  before = Does('before', When(steps=2, after_eval=True), record)
  evaluation = Evaluate('evaluate', When(steps=6, on_request='evaluate'),
                        record)
  after_eval = Does('after eval', When(after_eval=True), record)
  after_log = Does('after log', When(after_log=True), record)
  loop, _, _ = _loop([before, evaluation, after_eval, after_log], record,
                     total_steps=6, evaluation=evaluation)
  _run(loop)
  # After step 4: a log line (report every 4) of steps 1..4, no evaluation.
  assert after_log.seen[0] == (4, True, False, {'steps': 4}, None)
  assert _steps(record, 'after eval') == [6]
  # After step 6: the evaluation, the work after it with its results; the
  # work that ran before it runs again after it.
  assert record[-7:] == [('report', 6), ('before', 6), ('evaluate', 6),
                         ('before', 6), ('after eval', 6), ('after log', 6),
                         ('checkpoint', 6)]
  assert before.seen[-2][2] is False and before.seen[-1][2] is True
  assert after_eval.seen == [(6, True, True, {'steps': 2}, {'step': 6})]


def test_work_due_by_the_clock_runs_once_its_time_is_up():
  record, now = [], [0.0]
  timed = Does('timed', When(secs=10), record)
  loop, runner, _ = _loop([timed], record, total_steps=8, steps_per_loop=1,
                          report=When(at_end=True), clock=lambda: now[0])
  # Each loop takes 4 seconds: it is due after the first loop that starts
  # 10 seconds or more after the start (the flags go into the loop: the
  # one from 12 s, ending at step 4), then 10 seconds after it ran (16 s:
  # the loop from 28 s, ending at step 8).
  runner._on_loop = lambda step: now.__setitem__(0, now[0] + 4)  # pylint: disable=protected-access
  _run(loop)
  assert _steps(record, 'timed') == [4, 8]


def test_a_stop_ends_training_with_the_ends_work_and_the_checkpoint_last():
  record = []
  stops = Does('stops', When(steps=3), record,
               then=lambda event: event.step == 6 and event.request_stop(
                   'enough'))
  at_end = Does('at end', When(at_end=True), record)
  loop, runner, _ = _loop([stops, at_end], record, total_steps=20,
                          report=When(steps=4, at_end=True))
  stopped = _run(loop)
  assert (stopped.step, stopped.reason) == (6, 'enough')
  assert runner.step == 6
  # The stop made the end's work due, the report (earlier) too.
  assert record[-4:] == [('stops', 6), ('report', 6), ('at end', 6),
                         ('checkpoint', 6)]


def test_a_rollback_puts_the_weights_back_before_the_work_after_it():
  record = []
  rolls = Does('rolls back', When(steps=2), record,
               then=lambda event: event.step == 4 and event.request_rollback(
                   'a spike'))
  after = Does('after', When(steps=4), record)
  # The rollback runs before the report, as ctl's rollback action does.
  loop, _, saves = _loop([after], record, first=[rolls], total_steps=6,
                         report=When(steps=2),
                         checkpoint=When(steps=2, on_request='checkpoint'))
  _run(loop)
  at_4 = record[record.index(('rolls back', 4)):]
  assert at_4[:6] == [('rolls back', 4), ('restore_weights', 2),
                      ('restored', None), ('report', 4), ('after', 4),
                      ('checkpoint', 4)]
  # The report after the rollback had no step to report: no log line; the
  # one after step 6 reports steps 5..6.
  assert [seen[1] for seen in after.seen] == [False]
  assert loop._work.report.latest == {'steps': 2}  # pylint: disable=protected-access
  assert saves.saved == [0, 2, 4, 6]


def test_sigterm_between_loops_saves_after_the_next_loop_and_raises():
  record = []
  with tf_process.StopSignal() as stop_signal:
    sends = Does('sends SIGTERM', When(steps=3), record,
                 then=lambda event: event.step == 3 and os.kill(
                     os.getpid(), signal.SIGTERM))
    loop, runner, _ = _loop([sends], record, total_steps=12,
                            steps_per_loop=2, report=When(at_end=True),
                            stop_signal=stop_signal)
    with pytest.raises(errors.Preempted, match='after step 4 of 12'):
      _run(loop)
  assert stop_signal.received == 'SIGTERM'
  # The loop after the signal (step 4) carries its request; the checkpoint
  # is saved after it, though not due by its counts.
  assert runner.step == 4
  assert record[-1] == ('checkpoint', 4)


def test_the_checkpoint_runs_last_also_when_an_action_asks_for_it():
  record = []
  asks = Does('asks', When(steps=5), record,
              then=lambda event: event.request_checkpoint())
  later = Does('later', When(steps=5), record)
  loop, _, _ = _loop([asks, later], record, total_steps=10,
                     report=When(steps=5, at_end=True),
                     checkpoint=When(steps=100, on_request='checkpoint'))
  _run(loop)
  assert record == [('report', 5), ('asks', 5), ('later', 5),
                    ('checkpoint', 5), ('report', 10), ('asks', 10),
                    ('later', 10), ('checkpoint', 10)]


def test_a_loss_that_is_not_finite_stops_the_run_unless_an_action_handles_it():
  record = []
  loop, runner, _ = _loop([], record, total_steps=4, steps_per_loop=1,
                          checkpoint=When(steps=1))
  runner._loss = lambda step: float('nan') if step == 3 else 1.0  # pylint: disable=protected-access
  with pytest.raises(errors.CtlError, match='The training loss is nan after '
                     'step 3: it diverged at step 3'):
    _run(loop)
  assert _steps(record, 'checkpoint') == [1, 2]
  # An action that handles it (a rollback) sees it instead.
  record.clear()
  handles = Does('handles', When(every_loop=True), record)
  handles.handles_divergence = True
  loop, runner, _ = _loop([], record, first=[handles], total_steps=4,
                          steps_per_loop=1)
  runner._loss = lambda step: float('nan') if step == 3 else 1.0  # pylint: disable=protected-access
  _run(loop)
  assert _steps(record, 'handles') == [1, 2, 3, 4]


def test_the_schedule_alone_says_what_is_due_in_which_order():
  whens = [When(every_loop=True),            # 0: a rollback check
           When(steps=4),                    # 1: the report
           When(after_log=True),             # 2
           When(steps=8, on_request='evaluate'),  # 3: the evaluation
           When(after_eval=True, steps=4),   # 4
           When(at_end=True),                # 5
           When(steps=8, on_request='checkpoint')]  # 6: the checkpoint
  schedule = loop_plan.Schedule(whens, steps_per_epoch=100,
                                   total_steps=20, report=1, evaluation=3)
  assert [(first, end) for first, end in schedule.plan(0, 100)] == [
      (0, 1), (1, 4), (4, 8), (8, 12), (12, 16), (16, 20)]
  assert not schedule.report_due_at(6) and schedule.report_due_at(20)
  ran = []
  due = schedule.after_loop(8, ())
  for index in due:
    ran.append(index)
    if ran == [0, 1, 2, 3, 4]:  # After the evaluation: it does not rerun.
      due.requested(['evaluate'])
    due.gave(index, {'values': 1} if index in (1, 3) else None)
  assert ran == [0, 1, 2, 3, 4, 6]
  ran = []
  due = schedule.after_loop(12, ())
  for index in due:
    ran.append(index)
    if ran == [0, 1, 2, 4]:  # Asked once, as the loop tells new requests.
      due.requested(['stop', 'evaluate'])
    due.gave(index, {'values': 1} if index in (1, 3) else None)
  # The report had run: a stop does not run it again; the evaluation asked
  # for runs, and the work after it (4 again); the end's work.
  assert ran == [0, 1, 2, 4, 3, 4, 5]
